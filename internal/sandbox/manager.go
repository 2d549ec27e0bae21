// Package sandbox owns the lifecycle of sandboxes: create from a template,
// initialise the agent, expire at the end time, kill, and re-adopt or clean
// up after a restart of nook serve.
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nookhq/nook/internal/agentclient"
	"github.com/nookhq/nook/internal/agentwire"
	"github.com/nookhq/nook/internal/backupstore"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/runtime"
	"github.com/nookhq/nook/internal/store"
	"github.com/nookhq/nook/internal/template"
)

const bucket = "sandboxes"

// StateRunning is the state of a live sandbox.
const StateRunning = "running"

// Limits on what a create may ask for.
const (
	MaxTimeout     = 24 * time.Hour
	DefaultTimeout = 300 * time.Second
	readyTimeout   = 15 * time.Second
)

// Sandbox is the stored record of one sandbox.
type Sandbox struct {
	ID          string            `json:"id"`
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	EnvVars     map[string]string `json:"envVars,omitempty"`
	AccessToken string            `json:"accessToken"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUMillis   int64             `json:"cpuMillis"`
	MemoryMB    int64             `json:"memoryMB"`
	DiskMB      int64             `json:"diskMB"`
	State       string            `json:"state"`
	// PauseInfo: lifecycle settings and pause state (see pause.go).
	PauseInfo
}

// CreateOptions are what a caller may choose for a new sandbox.
type CreateOptions struct {
	Template string
	Timeout  time.Duration
	Metadata map[string]string
	EnvVars  map[string]string
	Network  NetworkConfig
	// NoPool makes this create boot a new sandbox even when a warm one is
	// waiting (for measuring cold creates).
	NoPool bool
	// Lifecycle: auto-pause at the end time, auto-resume (see pause.go).
	Lifecycle
	// from starts the sandbox from a copied writable layer (clone).
	from *startFrom
}

// Network gives sandboxes their network namespaces. Without one (nil),
// each sandbox gets a new loopback-only namespace from the runtime.
type Network interface {
	// Setup makes the network of sandbox id: the network namespace the
	// runtime joins, plus files and env the sandbox needs (resolv.conf,
	// trusted CA). On error nothing of it is left.
	Setup(ctx context.Context, id string, cfg NetworkConfig) (NetworkSetup, error)
	// Teardown removes everything Setup made for id; unknown ids are fine.
	Teardown(ctx context.Context, id string) error
}

// NetworkConfig is a sandbox's network settings as the create asked.
type NetworkConfig struct {
	// AllowInternet is E2B's allow_internet_access (nil: the default, true).
	AllowInternet *bool `json:"allowInternet,omitempty"`
	// AllowOut and DenyOut are E2B's allowOut/denyOut: CIDRs, IPs or host
	// globs ("*.example.com"). Allow wins over deny.
	AllowOut []string `json:"allowOut,omitempty"`
	DenyOut  []string `json:"denyOut,omitempty"`
	// Rules are E2B's rules: host pattern -> header transforms.
	Rules map[string][]NetworkRule `json:"rules,omitempty"`
	// AllowedHosts, DeniedHosts and Handlers are the native (Cloudflare
	// style) policy: allowed-hosts gate, denied host globs, per-host
	// handler URLs ("*" = catch-all). See internal/network.
	AllowedHosts []string          `json:"allowedHosts,omitempty"`
	DeniedHosts  []string          `json:"deniedHosts,omitempty"`
	Handlers     map[string]string `json:"handlers,omitempty"`
}

// Config wires a Manager to its parts.
type Config struct {
	Network   Network // optional
	DataDir   string
	AgentPath string // host path of the nook-agent binary
	// InterpPath is the host path of nook-interp, mounted beside the agent
	// in sandboxes whose template has a code interpreter.
	InterpPath string
	Runtime    runtime.Runtime
	Store      *store.Store
	Templates  *template.Registry
	Log        *slog.Logger
	// PoolSize is how many warm sandboxes to keep per template whose own
	// pool size is unset (negative); 0 disables pooling.
	PoolSize int
	// BackupRemote, when set, keeps a copy of every backup (an S3 bucket;
	// backup.go).
	BackupRemote backupstore.Store
}

// Manager creates, tracks and ends sandboxes.
type Manager struct {
	cfg    Config
	runDir string
	// logDir holds PID 1's output of each sandbox; it is never mounted into
	// a sandbox (the run dir is, and its root could plant symlinks there).
	logDir string
	pool   *pool

	ops opLocks // one pause/resume/kill of a sandbox at a time (pause.go)
	// creating counts creates in flight and lastCreate is when the last one
	// answered (unix ns): the pool refills once both say the API is quiet.
	creating   atomic.Int64
	lastCreate atomic.Int64
	mu         sync.Mutex
	live       map[string]*live  // guarded by mu
	killHooks  []func(id string) // guarded by mu
}

// live is a running sandbox's in-memory state. Its fields are guarded by
// Manager.mu.
type live struct {
	rec   Sandbox
	agent *agentclient.Client
	timer *time.Timer
}

// NewManager returns a manager; call Recover before serving.
func NewManager(cfg Config) (*Manager, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if _, err := os.Stat(cfg.AgentPath); err != nil {
		return nil, fmt.Errorf("agent binary: %w", err)
	}
	m := &Manager{cfg: cfg, runDir: filepath.Join(cfg.DataDir, "run"), logDir: filepath.Join(cfg.DataDir, "logs"), live: map[string]*live{}}
	m.pool = newPool(m, cfg.PoolSize)
	if err := os.MkdirAll(m.runDir, 0o711); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(m.logDir, 0o700); err != nil {
		return nil, err
	}
	return m, nil
}

var idPattern = regexp.MustCompile(`^[a-z0-9]{1,64}$`)

// ValidID reports whether s has the shape of a sandbox id.
func ValidID(s string) bool { return idPattern.MatchString(s) }

// newID returns an E2B-shaped id: "i" and 20 characters of [a-z0-9].
func newID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return "i" + string(b)
}

func newToken() string {
	b := make([]byte, 24)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// ValidateEnv checks environment variable names: non-empty, no '=' and no NUL.
func ValidateEnv(env map[string]string) error {
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return fmt.Errorf("invalid environment variable name %q: %w", k, errdefs.ErrInvalid)
		}
		if strings.ContainsRune(v, 0) {
			return fmt.Errorf("environment variable %q: value contains NUL: %w", k, errdefs.ErrInvalid)
		}
	}
	return nil
}

func (m *Manager) logPath(id string) string { return filepath.Join(m.logDir, id+".log") }

func (m *Manager) socketPath(id string) string {
	return filepath.Join(m.runDir, id, agentwire.SocketName)
}

// Create starts a sandbox from a template (or claims a warm one from the
// template's pool) and answers once its agent is initialised. On error
// nothing of the sandbox is left behind.
func (m *Manager) Create(ctx context.Context, o CreateOptions) (_ Sandbox, err error) {
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Timeout < 0 || o.Timeout > MaxTimeout {
		return Sandbox{}, fmt.Errorf("timeout must be between 1 s and %s: %w", MaxTimeout, errdefs.ErrInvalid)
	}
	if err := ValidateEnv(o.EnvVars); err != nil {
		return Sandbox{}, err
	}
	tpl, err := m.resolveTemplate(o.Template)
	if err != nil {
		return Sandbox{}, err
	}
	if tpl.State != template.StateReady {
		return Sandbox{}, fmt.Errorf("template %q is %s, not READY: %w", tpl.ID, tpl.State, errdefs.ErrConflict)
	}
	m.creating.Add(1)
	defer func() {
		m.lastCreate.Store(time.Now().UnixNano())
		m.creating.Add(-1)
	}()
	t0 := time.Now()
	b, pooled := booted{}, false
	if o.from == nil {
		b, pooled = m.pool.claim(tpl, o)
	}
	// The template's default egress policy, field by field unless the
	// create gave that field (pooled sandboxes booted with the default).
	o.Network = WithTemplateNetwork(tpl, o.Network)
	if !pooled {
		if b, err = m.bootFrom(ctx, newID(), tpl, o.Network, o.from); err != nil {
			return Sandbox{}, err
		}
	}
	defer func() {
		if err != nil {
			m.cleanup(ctx, b.id)
		}
	}()
	m.pool.refill(tpl.ID)
	now := time.Now().UTC()
	rec := Sandbox{
		ID: b.id, TemplateID: tpl.ID, Metadata: o.Metadata, EnvVars: o.EnvVars,
		AccessToken: newToken(), StartedAt: now, EndAt: now.Add(o.Timeout),
		CPUMillis: tpl.CPUMillis, MemoryMB: tpl.MemoryMB, DiskMB: tpl.DiskMB, State: StateRunning,
	}
	rec.PauseInfo = newPauseInfo(tpl, o)
	if len(tpl.Aliases) > 0 {
		rec.Alias = tpl.Aliases[0]
	}
	tBoot := time.Now()
	ictx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if err := b.agent.Init(ictx, agentclient.InitRequest{EnvVars: o.EnvVars, AccessToken: rec.AccessToken}); err != nil {
		return Sandbox{}, err
	}
	tInit := time.Now()
	if err := m.cfg.Store.Put(bucket, b.id, rec); err != nil {
		return Sandbox{}, err
	}
	tStore := time.Now()
	m.mu.Lock()
	l := &live{rec: rec, agent: b.agent}
	m.live[b.id] = l
	m.armLocked(l)
	m.mu.Unlock()
	m.cfg.Log.Info("sandbox created", "id", b.id, "template", tpl.ID, "pooled", pooled)
	m.cfg.Log.Debug("create timing", "id", b.id, "boot", tBoot.Sub(t0), "init", tInit.Sub(tBoot), "store", tStore.Sub(tInit))
	return rec, nil
}

// booted is a started sandbox whose agent answers but has not been
// initialised: no access token, no sandbox env, no record yet.
type booted struct {
	id    string
	agent *agentclient.Client
}

// boot starts a sandbox of tpl and waits for its agent and the template's
// probe. On error nothing of it is left.
func (m *Manager) boot(ctx context.Context, tpl template.Template, netCfg NetworkConfig) (_ booted, err error) {
	return m.bootFrom(ctx, newID(), tpl, netCfg, nil)
}

// bootFrom is boot of sandbox id, from a saved writable layer (and memory)
// when from is set (resume, clone). A failed resume leaves the record and
// the paused state alone.
func (m *Manager) bootFrom(ctx context.Context, id string, tpl template.Template, netCfg NetworkConfig, from *startFrom) (_ booted, err error) {
	runDir := filepath.Join(m.runDir, id)
	if err := os.Mkdir(runDir, 0o700); err != nil && !(from.resuming() && os.IsExist(err)) {
		return booted{}, err
	}
	defer func() {
		if err != nil {
			if from.resuming() {
				m.releaseRunning(ctx, id)
			} else {
				m.cleanup(ctx, id)
			}
		}
	}()
	if err := os.Chown(runDir, runtime.HostUIDBase, runtime.HostUIDBase); err != nil {
		return booted{}, err
	}
	args := []string{agentwire.AgentPath, "--" + agentwire.SocketFlag, agentwire.RunDir + "/" + agentwire.SocketName}
	if tpl.WorkingDir != "" {
		args = append(args, "--"+agentwire.StartCwdFlag, tpl.WorkingDir)
	}
	if tpl.User != "" {
		args = append(args, "--"+agentwire.StartUserFlag, tpl.User)
	}
	if tpl.EnvdInheritImageEnv {
		args = append(args, "--envd-inherit-image-env")
	}
	if tpl.CodeInterpreter && m.cfg.InterpPath != "" {
		args = append(args, "--"+agentwire.CodeInterpreterFlag)
		if tpl.RunCodeInheritSandboxEnv {
			args = append(args, "--"+agentwire.RunCodeInheritEnvFlag)
		}
	}
	if len(tpl.Cmd) > 0 {
		args = append(append(args, "--"), tpl.Cmd...)
	}
	spec := runtime.Spec{
		ID: id, Hostname: id, Layers: tpl.Layers,
		Limits: runtime.Limits{
			CPUMillis: tpl.CPUMillis, MemoryBytes: tpl.MemoryMB << 20,
			PidsMax: tpl.PidsMax, WritableBytes: tpl.DiskMB << 20,
		},
		Args: args, Env: tpl.Env,
		Mounts: []runtime.Mount{
			{Source: m.cfg.AgentPath, Target: agentwire.AgentPath, ReadOnly: true},
			{Source: runDir, Target: agentwire.RunDir},
		},
		LogPath: m.logPath(id),
	}
	if tpl.CodeInterpreter && m.cfg.InterpPath != "" {
		spec.Mounts = append(spec.Mounts, runtime.Mount{Source: m.cfg.InterpPath, Target: agentwire.InterpPath, ReadOnly: true})
	}
	t0 := time.Now()
	if m.cfg.Network != nil {
		ns, err := m.cfg.Network.Setup(ctx, id, netCfg)
		if err != nil {
			return booted{}, fmt.Errorf("sandbox network: %w", err)
		}
		spec.NetNSPath, spec.UserNSPath = ns.NetNSPath, ns.UserNSPath
		spec.Mounts = append(spec.Mounts, ns.Mounts...)
		spec.Env = append(append([]string(nil), spec.Env...), ns.Env...)
	}
	spec.Runtime = tpl.Runtime
	tNet := time.Now()
	if !from.withMemory() {
		// nook listens on the agent's socket before the agent runs and
		// hands it over: the first request waits in its backlog instead
		// of polling until the agent has bound it.
		ln, err := listenAgentSocket(m.socketPath(id))
		if err != nil {
			return booted{}, fmt.Errorf("agent socket: %w", err)
		}
		spec.ExtraFiles = []*os.File{ln}
		spec.Args = append([]string{spec.Args[0], "--" + agentwire.ListenFDFlag, "3"}, spec.Args[1:]...)
	}
	err = m.startSpec(ctx, spec, from)
	// nook's copy goes once PID 1 has its own, before waiting for the
	// agent: with a driver that passes no files (gVisor) nobody may wait
	// on a socket no one will accept on (the agent listens itself then).
	for _, f := range spec.ExtraFiles {
		f.Close()
	}
	if err != nil {
		return booted{}, fmt.Errorf("start sandbox: %w", err)
	}
	tRuntime := time.Now()
	agent := agentclient.New(m.socketPath(id))
	rctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if err := agent.WaitReady(rctx); err != nil {
		return booted{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	tAgent := time.Now()
	if tpl.ProbePort > 0 && !from.withMemory() {
		if err := Probe(ctx, agent, tpl.ProbePort, tpl.ProbePath, tpl.ProbeTimeout); err != nil {
			return booted{}, fmt.Errorf("sandbox %s: %v: %w", id, err, errdefs.ErrUnavailable)
		}
	}
	m.cfg.Log.Debug("sandbox booted", "id", id, "network", tNet.Sub(t0), "runtime", tRuntime.Sub(tNet),
		"agent", tAgent.Sub(tRuntime), "probe", time.Since(tAgent))
	return booted{id: id, agent: agent}, nil
}

// armLocked (re)starts the expiry timer of l. Preconditions: m.mu held.
func (m *Manager) armLocked(l *live) {
	if l.timer != nil {
		l.timer.Stop()
	}
	id, endAt := l.rec.ID, l.rec.EndAt
	l.timer = time.AfterFunc(time.Until(endAt), func() { m.expire(id, endAt) })
}

// expire kills id if its end time is still endAt (a moved end time re-arms
// the timer, so a stale timer must not kill).
func (m *Manager) expire(id string, endAt time.Time) {
	m.mu.Lock()
	l, ok := m.live[id]
	stale := !ok || !l.rec.EndAt.Equal(endAt)
	m.mu.Unlock()
	if stale {
		return
	}
	if m.expirePause(id) {
		return
	}
	m.cfg.Log.Info("sandbox reached its end time", "id", id)
	if err := m.Kill(context.Background(), id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		m.cfg.Log.Error("kill expired sandbox", "id", id, "err", err)
	}
}

func (m *Manager) lookup(id string) (*live, error) {
	if !ValidID(id) {
		return nil, fmt.Errorf("sandbox id %q: %w", id, errdefs.ErrInvalid)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.live[id]
	if !ok {
		return nil, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return l, nil
}

// Get returns a sandbox's record.
func (m *Manager) Get(id string) (Sandbox, error) {
	l, err := m.lookup(id)
	if err != nil {
		return Sandbox{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return l.rec, nil
}

// Agent returns the client of a sandbox's agent and its record.
func (m *Manager) Agent(id string) (*agentclient.Client, Sandbox, error) {
	l, err := m.lookup(id)
	if err != nil {
		return nil, Sandbox{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if l.rec.State == StatePaused {
		return nil, l.rec, fmt.Errorf("sandbox %q is paused (resume it with connect): %w", id, ErrPaused)
	}
	return l.agent, l.rec, nil
}

// List returns every sandbox, newest first.
func (m *Manager) List() []Sandbox {
	m.mu.Lock()
	out := make([]Sandbox, 0, len(m.live))
	for _, l := range m.live {
		out = append(out, l.rec)
	}
	m.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].StartedAt.Equal(out[j].StartedAt) {
			return out[i].StartedAt.After(out[j].StartedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// SetTimeout moves a sandbox's end time to now + d.
func (m *Manager) SetTimeout(id string, d time.Duration) (Sandbox, error) {
	if d <= 0 || d > MaxTimeout {
		return Sandbox{}, fmt.Errorf("timeout must be between 1 s and %s: %w", MaxTimeout, errdefs.ErrInvalid)
	}
	return m.update(id, func(r *Sandbox) { r.EndAt = time.Now().UTC().Add(d) })
}

// Extend moves a sandbox's end time to now + d unless it is already later.
func (m *Manager) Extend(id string, d time.Duration) (Sandbox, error) {
	if d < 0 || d > MaxTimeout {
		return Sandbox{}, fmt.Errorf("timeout must be between 0 s and %s: %w", MaxTimeout, errdefs.ErrInvalid)
	}
	return m.update(id, func(r *Sandbox) {
		if end := time.Now().UTC().Add(d); end.After(r.EndAt) {
			r.EndAt = end
		}
	})
}

func (m *Manager) update(id string, fn func(*Sandbox)) (Sandbox, error) {
	l, err := m.lookup(id)
	if err != nil {
		return Sandbox{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if l.rec.State == StatePaused {
		return Sandbox{}, fmt.Errorf("sandbox %q is paused; resume it first: %w", id, errdefs.ErrConflict)
	}
	rec := l.rec
	fn(&rec)
	if err := m.cfg.Store.Put(bucket, id, rec); err != nil {
		return Sandbox{}, err
	}
	l.rec = rec
	m.armLocked(l)
	return rec, nil
}

// OnKill registers fn to be called with the id of every sandbox that is
// killed or expires (e.g. to drop in-memory state of it), before cleanup.
func (m *Manager) OnKill(fn func(id string)) {
	m.mu.Lock()
	m.killHooks = append(m.killHooks, fn)
	m.mu.Unlock()
}

// Kill ends a sandbox and removes everything it had.
func (m *Manager) Kill(ctx context.Context, id string) error {
	if ValidID(id) {
		defer m.ops.lock(id)()
	}
	l, err := m.lookup(id)
	if err != nil {
		return err
	}
	m.mu.Lock()
	if m.live[id] != l {
		m.mu.Unlock()
		return fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	delete(m.live, id)
	l.timer.Stop()
	hooks := m.killHooks
	m.mu.Unlock()
	for _, fn := range hooks {
		fn(id)
	}
	l.agent.HTTP.CloseIdleConnections()
	if err := m.cleanup(ctx, id); err != nil {
		return err
	}
	m.cfg.Log.Info("sandbox killed", "id", id)
	return nil
}

// cleanup removes every resource of id: container, mounts, run dir, record.
func (m *Manager) cleanup(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := m.cfg.Runtime.Stop(ctx, id); err != nil {
		return fmt.Errorf("stop sandbox %s: %w", id, err)
	}
	if m.cfg.Network != nil {
		if err := m.cfg.Network.Teardown(ctx, id); err != nil {
			return fmt.Errorf("sandbox %s network: %w", id, err)
		}
	}
	if err := os.RemoveAll(filepath.Join(m.runDir, id)); err != nil {
		return err
	}
	if err := os.Remove(m.logPath(id)); err != nil && !os.IsNotExist(err) {
		return err
	}
	if err := m.removePaused(id); err != nil {
		return err
	}
	return m.cfg.Store.Delete(bucket, id)
}

// Recover re-adopts the sandboxes a previous nook serve left running and
// cleans up everything else it left: records whose sandbox is gone, runtime
// resources without a record, run dirs without either.
func (m *Manager) Recover(ctx context.Context) error {
	recs, err := store.All[Sandbox](m.cfg.Store, bucket)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, rec := range recs {
		known[rec.ID] = true
		if m.recoverPaused(ctx, rec) || m.adopt(ctx, rec) {
			continue
		}
		m.cfg.Log.Warn("sandbox from an earlier run is gone; cleaning up", "id", rec.ID)
		if err := m.cleanup(ctx, rec.ID); err != nil {
			m.cfg.Log.Error("cleanup", "id", rec.ID, "err", err)
		}
	}
	ids, err := m.cfg.Runtime.List(ctx)
	if err != nil {
		return err
	}
	entries, _ := os.ReadDir(m.runDir)
	for _, e := range entries {
		ids = append(ids, e.Name())
	}
	for _, id := range ids {
		if known[id] {
			continue
		}
		known[id] = true
		m.cfg.Log.Warn("removing leftovers of an unknown sandbox", "id", id)
		if err := m.cleanup(ctx, id); err != nil {
			m.cfg.Log.Error("cleanup", "id", id, "err", err)
		}
	}
	m.sweepStored(known)
	return nil
}

// adopt takes over a running sandbox whose agent still answers.
func (m *Manager) adopt(ctx context.Context, rec Sandbox) bool {
	if !rec.EndAt.After(time.Now()) {
		return false
	}
	info, err := m.cfg.Runtime.Inspect(ctx, rec.ID)
	if err != nil || !info.Running {
		return false
	}
	agent := agentclient.New(m.socketPath(rec.ID))
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := agent.WaitReady(rctx); err != nil {
		return false
	}
	m.mu.Lock()
	l := &live{rec: rec, agent: agent}
	m.live[rec.ID] = l
	m.armLocked(l)
	m.mu.Unlock()
	m.cfg.Log.Info("re-adopted sandbox", "id", rec.ID)
	return true
}

// listenAgentSocket listens on the agent's socket path (replacing whatever
// is there: the run dir of a resumed sandbox was writable by it) and
// returns the listening socket as a file, to be passed to PID 1.
func listenAgentSocket(path string) (*os.File, error) {
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	l.SetUnlinkOnClose(false)
	f, err := l.File()
	l.Close()
	if err != nil {
		os.Remove(path)
		return nil, err
	}
	return f, nil
}
