// Package native implements nook's native face (Cloudflare Sandbox SDK 1.0
// semantics): sandboxes addressed by caller-chosen names, exec with process
// handles (logs with cursors, output, waits, kill), setEnvVars and
// terminals. The bookkeeping (output logs, cursors, retention, stored names)
// lives here in nook serve's memory; the sandbox's agent only launches
// processes, with the exact environment derived here by envmodel.
package native

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sort"
	"sync"
	"time"

	"github.com/nookhq/nook/internal/envmodel"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/runtime"
	"github.com/nookhq/nook/internal/sandbox"
	"github.com/nookhq/nook/internal/template"
)

// MaxFinished is how many finished process (and terminal) records a
// sandbox keeps; older ones are forgotten.
const MaxFinished = 64

// Metadata keys that record a named sandbox's namespace and name.
const (
	MetaNamespace = "nook.namespace"
	MetaName      = "nook.name"
)

// DefaultNamedTimeout is the lifetime of a named sandbox, renewed by every
// getSandbox of it.
const DefaultNamedTimeout = 30 * time.Minute

// ErrTimeout is returned when a wait ends before its condition.
var ErrTimeout = errors.New("timed out")

// Service is the native face's state.
type Service struct {
	Sandboxes *sandbox.Manager
	Templates *template.Registry
	// Execer runs OCI exec (nook exec); nil disables it.
	Execer runtime.Execer
	Log    *slog.Logger
	// DefaultTemplate is what a named sandbox is created from (default "base").
	DefaultTemplate string

	mu    sync.Mutex
	boxes map[string]*box
	names map[string]*sync.Mutex
}

// box is the native state of one sandbox.
type box struct {
	id     string
	ctx    context.Context // ends when the sandbox dies
	cancel context.CancelFunc

	mu       sync.Mutex
	stored   envmodel.Env
	procs    map[string]*proc
	finished []string // finished process ids, oldest first
	terms    map[string]*proc
	finTerms []string
}

// New returns a service; register Drop as the sandbox manager's kill hook.
func New(s *Service) *Service {
	if s.Log == nil {
		s.Log = slog.Default()
	}
	if s.DefaultTemplate == "" {
		s.DefaultTemplate = template.BaseID
	}
	s.boxes = map[string]*box{}
	s.names = map[string]*sync.Mutex{}
	return s
}

// Drop forgets everything of sandbox id (stored names, processes,
// terminals) and ends its streams. The manager calls it when the sandbox dies.
func (s *Service) Drop(id string) {
	s.mu.Lock()
	b := s.boxes[id]
	delete(s.boxes, id)
	s.mu.Unlock()
	if b != nil {
		b.cancel()
	}
}

// box returns the native state of a live sandbox.
// The sandbox env layer starts as the sandbox's create envs; setEnvVars
// mutates it from there.
func (s *Service) box(id string) (*box, error) {
	rec, err := s.Sandboxes.Get(id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.boxes[id]
	if b == nil {
		ctx, cancel := context.WithCancel(context.Background())
		b = &box{id: id, ctx: ctx, cancel: cancel, stored: copyEnv(rec.EnvVars), procs: map[string]*proc{}, terms: map[string]*proc{}}
		s.boxes[id] = b
	}
	return b, nil
}

func newID(prefix string) string {
	b := make([]byte, 8)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// ---- named sandboxes ----

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// ValidName reports whether s may be a namespace or a sandbox name: 1-63
// characters of letters, digits, '.', '_' and '-', starting with a letter
// or digit.
func ValidName(s string) bool { return namePattern.MatchString(s) }

// GetOptions are the options of getSandbox.
type GetOptions struct {
	Template string        // only used when the sandbox is created
	Timeout  time.Duration // lifetime, renewed on every use
	EnvVars  map[string]string
}

// GetSandbox returns the sandbox named name in namespace ns, creating it from
// the template on first use; later uses reach the same sandbox and renew its
// lifetime.
func (s *Service) GetSandbox(ctx context.Context, ns, name string, o GetOptions) (sandbox.Sandbox, bool, error) {
	if !ValidName(ns) {
		return sandbox.Sandbox{}, false, fmt.Errorf("namespace %q: want 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit: %w", ns, errdefs.ErrInvalid)
	}
	if !ValidName(name) {
		return sandbox.Sandbox{}, false, fmt.Errorf("sandbox name %q: want 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit: %w", name, errdefs.ErrInvalid)
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultNamedTimeout
	}
	key := ns + "/" + name
	s.mu.Lock()
	lk := s.names[key]
	if lk == nil {
		lk = &sync.Mutex{}
		s.names[key] = lk
	}
	s.mu.Unlock()
	lk.Lock()
	defer lk.Unlock()
	for _, sb := range s.Sandboxes.List() {
		if sb.Metadata[MetaNamespace] == ns && sb.Metadata[MetaName] == name {
			rec, err := s.Sandboxes.Extend(sb.ID, o.Timeout)
			if err != nil {
				return sandbox.Sandbox{}, false, err
			}
			return rec, false, nil
		}
	}
	tpl := o.Template
	if tpl == "" {
		tpl = s.DefaultTemplate
	}
	rec, err := s.Sandboxes.Create(context.WithoutCancel(ctx), sandbox.CreateOptions{
		Template: tpl, Timeout: o.Timeout, EnvVars: o.EnvVars,
		Metadata: map[string]string{MetaNamespace: ns, MetaName: name},
	})
	if err != nil {
		return sandbox.Sandbox{}, false, err
	}
	return rec, true, nil
}

// ---- setEnvVars ----

// SetEnvVars stores (value) or removes (nil) names sandbox-wide for later
// exec launches. They live in nook serve's memory only. It returns the
// stored names afterwards.
func (s *Service) SetEnvVars(id string, vars envmodel.Launch) (envmodel.Env, error) {
	if err := envmodel.ValidateLaunch(vars); err != nil {
		return nil, fmt.Errorf("%v: %w", err, errdefs.ErrInvalid)
	}
	b, err := s.box(id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for k, v := range vars {
		if v == nil {
			delete(b.stored, k)
		} else {
			b.stored[k] = *v
		}
	}
	return copyEnv(b.stored), nil
}

// EnvVars returns the stored names of a sandbox.
func (s *Service) EnvVars(id string) (envmodel.Env, error) {
	b, err := s.box(id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return copyEnv(b.stored), nil
}

func copyEnv(e envmodel.Env) envmodel.Env {
	out := make(envmodel.Env, len(e))
	for k, v := range e {
		out[k] = v
	}
	return out
}

// imageEnv is the sandbox's image environment as its PID 1 has it, and the
// user native launches run as.
func (s *Service) imageEnv(rec sandbox.Sandbox) (envmodel.Env, string, string) {
	tpl, err := s.Templates.Get(rec.TemplateID)
	if err != nil {
		s.Log.Warn("template of sandbox not found; using a default image env", "sandbox", rec.ID, "template", rec.TemplateID, "err", err)
	}
	user := tpl.User
	home := ""
	if user == "" || user == "root" || user == "0" || user == "0:0" {
		user, home = "root", "/root"
	}
	return envmodel.Image(tpl.Env, home), user, tpl.WorkingDir
}

// ---- listing and retention ----

func (b *box) table(kind string) (map[string]*proc, *[]string) {
	if kind == kindTerminal {
		return b.terms, &b.finTerms
	}
	return b.procs, &b.finished
}

func (b *box) add(p *proc) {
	b.mu.Lock()
	defer b.mu.Unlock()
	m, _ := b.table(p.kind)
	m[p.id] = p
}

// finish records that p ended and forgets the oldest finished records past
// MaxFinished.
func (b *box) finish(p *proc) {
	b.mu.Lock()
	defer b.mu.Unlock()
	m, fin := b.table(p.kind)
	if m[p.id] != p {
		return
	}
	*fin = append(*fin, p.id)
	for len(*fin) > MaxFinished {
		delete(m, (*fin)[0])
		*fin = (*fin)[1:]
	}
}

func (s *Service) get(id, kind, pid string) (*proc, error) {
	b, err := s.box(id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	m, _ := b.table(kind)
	p := m[pid]
	if p == nil {
		return nil, fmt.Errorf("%s %q not found in sandbox %s: %w", kind, pid, id, errdefs.ErrNotFound)
	}
	return p, nil
}

func (s *Service) list(id, kind string) ([]Info, error) {
	b, err := s.box(id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	ps := make([]*proc, 0, len(b.procs))
	m, _ := b.table(kind)
	for _, p := range m {
		ps = append(ps, p)
	}
	b.mu.Unlock()
	sort.Slice(ps, func(i, j int) bool { return ps[i].started.Before(ps[j].started) })
	out := make([]Info, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.info())
	}
	return out, nil
}

// GetProcess returns a process's info.
func (s *Service) GetProcess(id, pid string) (Info, error) {
	p, err := s.get(id, kindProcess, pid)
	if err != nil {
		return Info{}, err
	}
	return p.info(), nil
}

// ListProcesses lists running and retained finished processes, oldest first.
func (s *Service) ListProcesses(id string) ([]Info, error) { return s.list(id, kindProcess) }

// GetTerminal returns a terminal's info.
func (s *Service) GetTerminal(id, tid string) (Info, error) {
	p, err := s.get(id, kindTerminal, tid)
	if err != nil {
		return Info{}, err
	}
	return p.info(), nil
}

// ListTerminals lists running and retained finished terminals.
func (s *Service) ListTerminals(id string) ([]Info, error) { return s.list(id, kindTerminal) }
