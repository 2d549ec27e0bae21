// Package agent implements nook-agent, the in-sandbox daemon that speaks the
// envd protocol (Connect RPC process/filesystem services, /files, /init,
// /envs, /health, /metrics) plus a CONNECT tunnel on a unix socket.
package agent

import (
	"context"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nookhq/nook/internal/agentwire"
	"github.com/nookhq/nook/internal/envdpb/filesystem/filesystemconnect"
	"github.com/nookhq/nook/internal/envdpb/process/processconnect"
)

// Config configures a Server.
type Config struct {
	// AgentEnv is the agent's own (image) environment; defaults to os.Environ().
	AgentEnv []string
	// InheritImageEnv makes envd processes start from AgentEnv instead of PATH only.
	InheritImageEnv bool
	// PasswdPath and GroupPath default to /etc/passwd and /etc/group.
	PasswdPath, GroupPath string
	// DefaultUser and DefaultWorkdir apply until /init sets them.
	DefaultUser, DefaultWorkdir string
	// Reaper waits for children; one is created when nil.
	Reaper *Reaper
}

// Server is the agent's state and HTTP handler.
type Server struct {
	cfg    Config
	users  *userDB
	reaper *Reaper
	procs  *processTable
	watch  *watcherTable
	mux    *http.ServeMux

	mu             sync.RWMutex
	envVars        map[string]string
	accessToken    string
	defaultUser    string
	defaultWorkdir string
}

// New builds a Server.
func New(cfg Config) *Server {
	if cfg.AgentEnv == nil {
		cfg.AgentEnv = os.Environ()
	}
	if cfg.Reaper == nil {
		cfg.Reaper = NewReaper()
	}
	s := &Server{
		cfg:            cfg,
		users:          newUserDB(cfg.PasswdPath, cfg.GroupPath),
		reaper:         cfg.Reaper,
		procs:          newProcessTable(),
		watch:          newWatcherTable(),
		envVars:        map[string]string{},
		defaultUser:    cfg.DefaultUser,
		defaultWorkdir: cfg.DefaultWorkdir,
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("GET /envs", s.handleEnvs)
	mux.HandleFunc("POST /init", s.handleInit)
	mux.HandleFunc("GET /metrics", s.handleMetrics)
	mux.HandleFunc("GET /files", s.handleFileGet)
	mux.HandleFunc("POST /files", s.handleFilePost)
	s.nativeRoutes(mux)
	p, h := processconnect.NewProcessHandler(&processService{s: s})
	mux.Handle(p, h)
	p, h = filesystemconnect.NewFilesystemHandler(&fsService{s: s})
	mux.Handle(p, h)
	s.mux = mux
	return s
}

// ServeHTTP implements http.Handler: tunnel, auth, then routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodConnect {
		s.handleTunnel(w, r)
		return
	}
	if !s.authorized(r) {
		writeError(w, http.StatusUnauthorized, "unauthorized access, please provide a valid access token or method signing if supported")
		return
	}
	s.mux.ServeHTTP(w, r)
}

func (s *Server) token() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.accessToken
}

func (s *Server) authorized(r *http.Request) bool {
	if r.URL.Path == "/health" || r.URL.Path == "/init" {
		return true
	}
	tok := s.token()
	if tok == "" {
		return true
	}
	if got := r.Header.Get("X-Access-Token"); got != "" {
		return subtle.ConstantTimeCompare([]byte(got), []byte(tok)) == 1
	}
	if r.URL.Path == "/files" {
		return s.validSignature(r, tok)
	}
	return false
}

// ListenAndServe serves on a unix socket until ctx ends.
func (s *Server) ListenAndServe(ctx context.Context, socket string) error {
	ln, err := ListenUnix(socket)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 30 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	err = srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// ListenUnix removes a stale socket file, listens and chmods the socket 0600.
func ListenUnix(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// DefaultSocket is the socket path inside a sandbox.
var DefaultSocket = agentwire.RunDir + "/" + agentwire.SocketName

// ---- simple endpoints ----

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]any{"message": msg, "code": code})
}

func (s *Server) handleEnvs(w http.ResponseWriter, r *http.Request) {
	s.mu.RLock()
	m := make(map[string]string, len(s.envVars))
	for k, v := range s.envVars {
		m[k] = v
	}
	s.mu.RUnlock()
	writeJSON(w, http.StatusOK, m)
}

// InitRequest is the body of POST /init. Absent fields keep their value.
type InitRequest struct {
	EnvVars        map[string]string `json:"envVars"`
	AccessToken    *string           `json:"accessToken"`
	DefaultUser    *string           `json:"defaultUser"`
	DefaultWorkdir *string           `json:"defaultWorkdir"`
	HyperloopIP    string            `json:"hyperloopIP,omitempty"`
	Timestamp      string            `json:"timestamp,omitempty"`
}

func (s *Server) handleInit(w http.ResponseWriter, r *http.Request) {
	var req InitRequest
	body, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if len(strings.TrimSpace(string(body))) > 0 {
		if err := json.Unmarshal(body, &req); err != nil {
			writeError(w, http.StatusBadRequest, "invalid JSON: "+err.Error())
			return
		}
	}
	s.mu.Lock()
	if req.EnvVars != nil {
		s.envVars = map[string]string{}
		for k, v := range req.EnvVars {
			s.envVars[k] = v
		}
	}
	if req.AccessToken != nil {
		s.accessToken = *req.AccessToken
	}
	if req.DefaultUser != nil && *req.DefaultUser != "" {
		s.defaultUser = *req.DefaultUser
	}
	if req.DefaultWorkdir != nil && *req.DefaultWorkdir != "" {
		s.defaultWorkdir = *req.DefaultWorkdir
	}
	s.mu.Unlock()
	slog.Info("init", "envVars", len(req.EnvVars), "token", req.AccessToken != nil, "defaultUser", s.defaultUser)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) sandboxEnv() map[string]string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.envVars
}

// ---- users ----

// userFromRequest picks the user: explicit name, else Basic auth, else default.
func (s *Server) userFromRequest(h http.Header, explicit string) (*User, error) {
	name := explicit
	if name == "" {
		if a := h.Get("Authorization"); strings.HasPrefix(a, "Basic ") {
			if dec, err := base64.StdEncoding.DecodeString(strings.TrimSpace(a[6:])); err == nil {
				name, _, _ = strings.Cut(string(dec), ":")
			}
		}
	}
	if name == "" {
		name = s.defaultUserName()
	}
	u, err := s.users.Lookup(name)
	if err != nil {
		return nil, err
	}
	return u, nil
}

func (s *Server) defaultUserName() string {
	s.mu.RLock()
	du := s.defaultUser
	s.mu.RUnlock()
	if du != "" {
		return du
	}
	if s.users.Has("user") {
		return "user"
	}
	return "root"
}

func (s *Server) workdir() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.defaultWorkdir
}

// ---- tunnel ----

func (s *Server) handleTunnel(w http.ResponseWriter, r *http.Request) {
	target := r.Host
	if target == "" {
		target = r.RequestURI
	}
	host, port, err := net.SplitHostPort(target)
	if err != nil || port == "" {
		http.Error(w, "bad tunnel target", http.StatusBadRequest)
		return
	}
	switch host {
	case "localhost":
		host = "127.0.0.1"
	default:
		ip := net.ParseIP(host)
		if ip == nil || !ip.IsLoopback() {
			http.Error(w, "only loopback targets are allowed", http.StatusForbidden)
			return
		}
	}
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(host, port), 10*time.Second)
	if err != nil {
		http.Error(w, fmt.Sprintf("dial %s: %v", port, err), http.StatusBadGateway)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		conn.Close()
		http.Error(w, "hijack unsupported", http.StatusInternalServerError)
		return
	}
	client, brw, err := hj.Hijack()
	if err != nil {
		conn.Close()
		return
	}
	if _, err := client.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		client.Close()
		conn.Close()
		return
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		// Bytes the client sent after the CONNECT head may be buffered.
		if n := brw.Reader.Buffered(); n > 0 {
			b, _ := brw.Reader.Peek(n)
			if _, err := conn.Write(b); err != nil {
				return
			}
		}
		_, _ = io.Copy(conn, client)
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}()
	go func() {
		defer wg.Done()
		_, _ = io.Copy(client, conn)
		if cw, ok := client.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			client.Close()
		}
	}()
	go func() {
		wg.Wait()
		client.Close()
		conn.Close()
	}()
}
