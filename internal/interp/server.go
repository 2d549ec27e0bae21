// Package interp is nook's code interpreter: the E2B code-interpreter
// protocol (/execute, /contexts, /health on port 49999 of a sandbox) on
// real kernels. Python runs on Jupyter's ipykernel, spoken to over the
// Jupyter wire protocol (ZMTP, HMAC-SHA256 signed messages); JavaScript on
// a Node process running nook's REPL-based kernel; Bash on a persistent
// bash. Each context is one kernel; cells on one context run in order,
// contexts run concurrently.
package interp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Limits.
const (
	// MaxCodeBytes bounds one cell; larger ones get 413.
	MaxCodeBytes = 8 << 20
	// interruptGrace is how long an interrupted cell may take to stop
	// before its kernel is restarted.
	interruptGrace = 5 * time.Second
	keepaliveEvery = 5 * time.Second
)

// Starter starts a kernel.
type Starter func(KernelOptions) (Kernel, error)

// Languages maps language names (and aliases) to their canonical name.
var Languages = map[string]string{
	"python": "python", "python3": "python", "py": "python", "ipython": "python",
	"javascript": "javascript", "js": "javascript", "node": "javascript", "nodejs": "javascript",
	"bash": "bash", "sh": "bash", "shell": "bash",
}

// Config configures a Server.
type Config struct {
	// Starters by canonical language; defaults to Python, JavaScript, Bash.
	Starters map[string]Starter
	// Env is the kernels' base environment (the image env).
	Env []string
	// SandboxEnv, when set, returns the sandbox env, which every execution
	// then sees under its env_vars (run-code env inheritance); nil: kernels
	// do not see it.
	SandboxEnv func() (map[string]string, error)
	// User kernels run as (nil: nook-interp's user); DefaultCwd is a new
	// context's working directory when none is asked for.
	User       *User
	DefaultCwd string
	// StateDir holds per-kernel files (connection files, bash cells).
	StateDir string
	Log      *slog.Logger
}

// Server serves the code-interpreter protocol.
type Server struct {
	cfg Config
	mux *http.ServeMux

	mu       sync.Mutex
	contexts map[string]*Context
	defaults map[string]*Context // by language
	ready    chan struct{}       // closed once the default Python kernel is up (or failed)
}

// Context is one kernel and what it was made with.
type kernelRef struct{ k Kernel }

type Context struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`

	s    *Server
	jobs chan func() // executions, in arrival order, run one at a time
	quit chan struct{}

	kmu      sync.Mutex                // held while a kernel starts or runs a cell
	kernel   Kernel                    // guarded by kmu
	cur      atomic.Pointer[kernelRef] // the kernel, readable without kmu
	startErr error
	started  chan struct{} // closed when the first start attempt finished
}

// New returns a server; call Warm to start the default Python kernel.
func New(cfg Config) *Server {
	if cfg.Starters == nil {
		cfg.Starters = map[string]Starter{"python": StartPython, "javascript": StartNode, "bash": StartBash}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.DefaultCwd == "" {
		cfg.DefaultCwd = "/"
		if cfg.User != nil && cfg.User.Home != "" {
			cfg.DefaultCwd = cfg.User.Home
		}
	}
	if cfg.StateDir == "" {
		cfg.StateDir = os.TempDir()
	}
	s := &Server{cfg: cfg, contexts: map[string]*Context{}, defaults: map[string]*Context{}, ready: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", s.handleHealth)
	mux.HandleFunc("POST /execute", s.handleExecute)
	mux.HandleFunc("POST /contexts", s.handleCreateContext)
	mux.HandleFunc("GET /contexts", s.handleListContexts)
	mux.HandleFunc("DELETE /contexts/{id}", s.handleDeleteContext)
	mux.HandleFunc("POST /contexts/{id}/restart", s.handleRestartContext)
	s.mux = mux
	return s
}

// Warm starts the default context of each language given (the first one
// gates /health) in the background.
func (s *Server) Warm(languages ...string) {
	for i, lang := range languages {
		c, err := s.defaultContext(lang)
		if err != nil {
			s.cfg.Log.Error("default context", "language", lang, "err", err)
			if i == 0 {
				close(s.ready)
			}
			continue
		}
		if i == 0 {
			go func() {
				<-c.started
				close(s.ready)
			}()
		}
	}
	if len(languages) == 0 {
		close(s.ready)
	}
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Close kills every kernel.
func (s *Server) Close() {
	s.mu.Lock()
	cs := make([]*Context, 0, len(s.contexts))
	for _, c := range s.contexts {
		cs = append(cs, c)
	}
	s.contexts = map[string]*Context{}
	s.defaults = map[string]*Context{}
	s.mu.Unlock()
	for _, c := range cs {
		c.close()
	}
}

// ---- contexts ----

func (s *Server) newContext(lang, cwd string) (*Context, error) {
	canon, ok := Languages[strings.ToLower(strings.TrimSpace(lang))]
	if !ok {
		return nil, badRequest("unsupported language %q (supported: python, javascript, bash)", lang)
	}
	if _, ok := s.cfg.Starters[canon]; !ok {
		return nil, badRequest("language %q is not available in this sandbox", canon)
	}
	if cwd == "" {
		cwd = s.cfg.DefaultCwd
	}
	if !filepath.IsAbs(cwd) {
		return nil, badRequest("cwd %q must be an absolute path", cwd)
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		return nil, badRequest("cwd %q is not a directory", cwd)
	}
	c := &Context{ID: newID()[:16], Language: canon, Cwd: cwd, s: s, jobs: make(chan func()), quit: make(chan struct{}), started: make(chan struct{})}
	go c.worker()
	go func() {
		c.kmu.Lock()
		c.startErr = c.startLocked()
		c.kmu.Unlock()
		close(c.started)
	}()
	s.mu.Lock()
	s.contexts[c.ID] = c
	s.mu.Unlock()
	return c, nil
}

func (s *Server) defaultContext(lang string) (*Context, error) {
	canon, ok := Languages[strings.ToLower(strings.TrimSpace(lang))]
	if !ok {
		return nil, badRequest("unsupported language %q (supported: python, javascript, bash)", lang)
	}
	s.mu.Lock()
	c := s.defaults[canon]
	s.mu.Unlock()
	if c != nil {
		return c, nil
	}
	c, err := s.newContext(canon, "")
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev := s.defaults[canon]; prev != nil { // lost a race
		delete(s.contexts, c.ID)
		go c.close()
		return prev, nil
	}
	s.defaults[canon] = c
	return c, nil
}

func (s *Server) context(id string) *Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.contexts[id]
}

func (s *Server) removeContext(id string) *Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.contexts[id]
	delete(s.contexts, id)
	for lang, d := range s.defaults {
		if d == c {
			delete(s.defaults, lang)
		}
	}
	return c
}

// setKernelLocked sets the kernel. Preconditions: c.kmu held.
func (c *Context) setKernelLocked(k Kernel) {
	c.kernel = k
	c.cur.Store(&kernelRef{k})
}

// startLocked starts the context's kernel. Preconditions: c.kmu held.
func (c *Context) startLocked() error {
	s := c.s
	env := s.cfg.Env
	over := map[string]string{}
	if u := s.cfg.User; u != nil {
		over["HOME"], over["USER"], over["LOGNAME"] = u.Home, u.Name, u.Name
	}
	if !hasEnv(env, "PATH") {
		over["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	dir, err := os.MkdirTemp(s.cfg.StateDir, "ctx-"+c.ID+"-")
	if err != nil {
		return err
	}
	if u := s.cfg.User; u != nil && os.Getuid() == 0 {
		_ = os.Chown(dir, int(u.UID), int(u.GID))
	}
	start := time.Now()
	k, err := s.cfg.Starters[c.Language](KernelOptions{Cwd: c.Cwd, Env: envList(env, over), User: s.cfg.User, Dir: dir})
	if err != nil {
		s.cfg.Log.Error("kernel start failed", "context", c.ID, "language", c.Language, "err", err)
		return err
	}
	s.cfg.Log.Info("kernel started", "context", c.ID, "language", c.Language, "took", time.Since(start).Round(time.Millisecond))
	c.setKernelLocked(k)
	return nil
}

func hasEnv(env []string, key string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, key+"=") {
			return true
		}
	}
	return false
}

// worker runs the context's executions one at a time, in arrival order.
func (c *Context) worker() {
	for {
		select {
		case job := <-c.jobs:
			job()
		case <-c.quit:
			return
		}
	}
}

// restart replaces the kernel with a fresh one.
func (c *Context) restart() error {
	<-c.started
	c.kmu.Lock()
	defer c.kmu.Unlock()
	if c.kernel != nil {
		c.kernel.Close()
		c.setKernelLocked(nil)
	}
	c.startErr = c.startLocked()
	return c.startErr
}

func (c *Context) close() {
	select {
	case <-c.quit:
		return
	default:
		close(c.quit)
	}
	<-c.started
	c.kmu.Lock()
	defer c.kmu.Unlock()
	if c.kernel != nil {
		c.kernel.Close()
		c.setKernelLocked(nil)
	}
}

// execute runs one cell on the context's kernel. It is called on the
// context's worker. When ctx ends first (client gone or timed out) the
// cell is interrupted; a kernel that does not stop within interruptGrace
// is restarted.
func (c *Context) execute(ctx context.Context, code string, env map[string]string, emit func(Event)) {
	<-c.started
	c.kmu.Lock()
	defer c.kmu.Unlock()
	k := c.kernel
	if k == nil {
		// The last start failed: try again now.
		if c.startErr = c.startLocked(); c.startErr != nil {
			emit(errorEvent("KernelStartError", c.startErr.Error(), ""))
			return
		}
		k = c.kernel
	}
	select {
	case <-k.Dead():
		status := k.Status()
		k.Close()
		c.setKernelLocked(nil)
		msg := fmt.Sprintf("the %s kernel of context %s had died (%s); it was restarted and its state is lost, run the cell again", c.Language, c.ID, status)
		if c.startErr = c.startLocked(); c.startErr != nil {
			msg += "; restarting it failed: " + c.startErr.Error()
		}
		emit(errorEvent("DeadKernelError", msg, ""))
		return
	default:
	}
	done := make(chan error, 1)
	go func() { done <- k.Execute(code, env, emit) }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = k.Interrupt()
		select {
		case err = <-done:
		case <-time.After(interruptGrace):
			c.s.cfg.Log.Warn("kernel did not stop after an interrupt; restarting it", "context", c.ID)
			k.Close()
			<-done
			c.setKernelLocked(nil)
			c.startErr = c.startLocked()
			return
		}
	}
	if errors.Is(err, ErrKernelDied) {
		status := k.Status()
		k.Close()
		c.setKernelLocked(nil)
		emit(errorEvent("DeadKernelError", fmt.Sprintf("the %s kernel died during the cell (%s); it will be restarted on the next request and its state is lost", c.Language, status), ""))
	} else if err != nil {
		emit(errorEvent("InterpreterError", err.Error(), ""))
	}
}

// ---- HTTP ----

type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(f string, a ...any) error {
	return &httpError{code: http.StatusBadRequest, msg: fmt.Sprintf(f, a...)}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	var he *httpError
	if errors.As(err, &he) {
		code = he.code
	}
	writeJSON(w, code, map[string]any{"code": code, "message": err.Error()})
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	select {
	case <-s.ready:
		writeJSON(w, http.StatusOK, "OK")
	default:
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"code": 503, "message": "the default kernel is starting"})
	}
}

type executeRequest struct {
	Code      *string           `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

// readBody reads a JSON body of at most limit bytes; a larger one is read
// to its end (so the client sees the answer) and refused with 413.
func readBody(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return badRequest("reading the request: %v", err)
	}
	if int64(len(b)) > limit {
		_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 256<<20))
		return &httpError{code: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("the request is larger than %d bytes; a cell may have at most %d bytes of code", limit, MaxCodeBytes)}
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return badRequest("empty request body; want JSON")
	}
	if err := json.Unmarshal(b, v); err != nil {
		return badRequest("invalid JSON: %v", err)
	}
	return nil
}

func (s *Server) handleExecute(w http.ResponseWriter, r *http.Request) {
	var req executeRequest
	if err := readBody(w, r, MaxCodeBytes+64<<10, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Code == nil {
		writeError(w, badRequest("missing field code"))
		return
	}
	if len(*req.Code) > MaxCodeBytes {
		writeError(w, &httpError{code: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("the cell has %d bytes of code; at most %d are allowed", len(*req.Code), MaxCodeBytes)})
		return
	}
	if req.ContextID != "" && req.Language != "" {
		writeError(w, badRequest("give context_id or language, not both"))
		return
	}
	for k, v := range req.EnvVars {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			writeError(w, badRequest("invalid environment variable %q", k))
			return
		}
	}
	if s.cfg.SandboxEnv != nil {
		// Run-code env inheritance: the sandbox env as it is now, under
		// the execution's own env_vars.
		sbx, err := s.cfg.SandboxEnv()
		if err != nil {
			s.cfg.Log.Warn("sandbox env", "err", err)
		}
		if len(sbx) > 0 {
			for k, v := range req.EnvVars {
				sbx[k] = v
			}
			req.EnvVars = sbx
		}
	}
	var c *Context
	if req.ContextID != "" {
		if c = s.context(req.ContextID); c == nil {
			writeJSON(w, http.StatusNotFound, map[string]any{"code": 404, "message": fmt.Sprintf("context %q not found", req.ContextID)})
			return
		}
	} else {
		lang := req.Language
		if lang == "" {
			lang = "python"
		}
		var err error
		if c, err = s.defaultContext(lang); err != nil {
			writeError(w, err)
			return
		}
	}

	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()

	events := make(chan Event, 64)
	finished := make(chan struct{})
	job := func() {
		defer close(finished)
		emit := func(ev Event) {
			select {
			case events <- ev:
			case <-r.Context().Done():
			}
		}
		if r.Context().Err() != nil {
			return // gave up while queued
		}
		c.execute(r.Context(), *req.Code, req.EnvVars, emit)
	}
	select {
	case c.jobs <- job:
	case <-c.quit:
		writeLine(w, rc, errorEvent("ContextDeletedError", "the context was deleted", ""))
		writeLine(w, rc, Event{"type": "end_of_execution"})
		return
	case <-r.Context().Done():
		return
	}
	ka := time.NewTicker(keepaliveEvery)
	defer ka.Stop()
	broken := false
	for {
		select {
		case ev := <-events:
			if !broken && !writeLine(w, rc, ev) {
				broken = true // the client is gone: keep draining until the cell ends
			}
		case <-ka.C:
			if !broken {
				writeLine(w, rc, Event{"type": "keepalive"})
			}
		case <-finished:
			for drained := false; !drained; {
				select {
				case ev := <-events:
					if !broken {
						writeLine(w, rc, ev)
					}
				default:
					drained = true
				}
			}
			if !broken {
				writeLine(w, rc, Event{"type": "end_of_execution"})
			}
			return
		}
	}
}

func writeLine(w http.ResponseWriter, rc *http.ResponseController, ev Event) bool {
	b, err := json.Marshal(ev)
	if err != nil {
		return true
	}
	bw := bufio.NewWriterSize(w, len(b)+1)
	bw.Write(b)
	bw.WriteByte('\n')
	if bw.Flush() != nil {
		return false
	}
	return rc.Flush() == nil
}

type createContextRequest struct {
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func (s *Server) handleCreateContext(w http.ResponseWriter, r *http.Request) {
	var req createContextRequest
	if err := readBody(w, r, 64<<10, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Language == "" {
		req.Language = "python"
	}
	c, err := s.newContext(req.Language, req.Cwd)
	if err != nil {
		writeError(w, err)
		return
	}
	<-c.started
	if c.startErr != nil {
		s.removeContext(c.ID)
		c.close()
		writeError(w, fmt.Errorf("starting the %s kernel: %w", c.Language, c.startErr))
		return
	}
	writeJSON(w, http.StatusOK, c)
}

func (s *Server) handleListContexts(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	out := make([]*Context, 0, len(s.contexts))
	for _, c := range s.contexts {
		out = append(out, c)
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleDeleteContext(w http.ResponseWriter, r *http.Request) {
	c := s.removeContext(r.PathValue("id"))
	if c == nil {
		writeJSON(w, http.StatusNotFound, map[string]any{"code": 404, "message": fmt.Sprintf("context %q not found", r.PathValue("id"))})
		return
	}
	c.close()
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleRestartContext(w http.ResponseWriter, r *http.Request) {
	c := s.context(r.PathValue("id"))
	if c == nil {
		writeJSON(w, http.StatusNotFound, map[string]any{"code": 404, "message": fmt.Sprintf("context %q not found", r.PathValue("id"))})
		return
	}
	// Interrupt what runs so the restart does not wait behind it.
	<-c.started
	if err := c.restartNow(); err != nil {
		writeError(w, fmt.Errorf("restarting the %s kernel: %w", c.Language, err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// restartNow kills the kernel at once (a running cell ends with a dead
// kernel error) and starts a new one.
func (c *Context) restartNow() error {
	if ref := c.cur.Load(); ref != nil && ref.k != nil {
		ref.k.Close()
	}
	return c.restart()
}
