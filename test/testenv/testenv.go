// Package testenv is the harness shared by nook's root integration suites
// (test/integration, test/native, test/network, test/pause,
// test/templates): it finds the repo root, builds nook's binaries and runs a
// real `nook serve` that the suites start, stop, kill and restart.
package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// RootfsCache is the directory where the suites share built-in templates'
// root filesystems (NOOK_ROOTFS_CACHE), so that each is built once.
const RootfsCache = "/var/lib/nook-rootfs-cache"

// RepoRoot returns the module root: ../.. of the calling test package's
// directory, checked to hold nook's go.mod.
func RepoRoot() (string, error) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return "", err
	}
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", fmt.Errorf("repo root %s: %w", root, err)
	}
	if !bytes.Contains(mod, []byte("module github.com/nookhq/nook")) {
		return "", fmt.Errorf("%s/go.mod is not nook's", root)
	}
	return root, nil
}

// GoBinary returns the go command: the one on PATH, else /usr/local/go/bin/go.
func GoBinary() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

// Binaries are the paths of the built binaries; Interp is empty when the
// tree has no cmd/nook-interp.
type Binaries struct {
	Nook, Agent, Interp string
}

// Build builds nook, nook-agent and (if present) nook-interp from repoRoot
// with CGO_ENABLED=0 into outDir.
func Build(repoRoot, outDir string) (Binaries, error) {
	var b Binaries
	for _, t := range []struct {
		name string
		dst  *string
	}{{"nook-agent", &b.Agent}, {"nook", &b.Nook}, {"nook-interp", &b.Interp}} {
		if _, err := os.Stat(filepath.Join(repoRoot, "cmd", t.name)); err != nil && t.name == "nook-interp" {
			continue
		}
		out := filepath.Join(outDir, t.name)
		cmd := exec.Command(GoBinary(), "build", "-o", out, "./cmd/"+t.name)
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if o, err := cmd.CombinedOutput(); err != nil {
			return b, fmt.Errorf("go build ./cmd/%s: %v\n%s", t.name, err, o)
		}
		*t.dst = out
	}
	return b, nil
}

// RootfsCacheEnv returns NOOK_ROOTFS_CACHE=RootfsCache unless the
// environment already sets it, for Server.Env.
func RootfsCacheEnv() []string {
	if os.Getenv("NOOK_ROOTFS_CACHE") != "" {
		return nil
	}
	return []string{"NOOK_ROOTFS_CACHE=" + RootfsCache}
}

// DefaultTimeout bounds Start's wait for /health when Server.Timeout is 0.
const DefaultTimeout = 10 * time.Minute

// Server is a `nook serve` process under test. Set the fields, then Start
// it; it may be stopped, killed and started again.
type Server struct {
	Bin       string   // the nook binary
	DataDir   string   // --data-dir
	APIAddr   string   // --listen
	ProxyAddr string   // --proxy-listen
	APIKey    string   // --api-key
	AgentPath string   // --agent-path; omitted when empty
	Flags     []string // more flags for nook serve
	Env       []string // added to the test process's environment
	LogPath   string   // stdout and stderr are appended here
	Timeout   time.Duration
	// Setpgid runs nook serve in its own process group.
	Setpgid bool

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Start runs nook serve with extra flags after Flags and waits (up to
// Timeout) until GET /health answers 204. It fails at once if the process
// exits, and ends the process if it does not come up.
func (s *Server) Start(extra ...string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	logf, err := os.OpenFile(s.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "=== nook serve started by the tests at %s ===\n", time.Now().Format(time.RFC3339))
	args := []string{"serve", "--data-dir", s.DataDir, "--api-key", s.APIKey,
		"--listen", s.APIAddr, "--proxy-listen", s.ProxyAddr}
	if s.AgentPath != "" {
		args = append(args, "--agent-path", s.AgentPath)
	}
	args = append(append(args, s.Flags...), extra...)
	cmd := exec.Command(s.Bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), s.Env...)
	if s.Setpgid {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
	timeout := s.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	hc := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			s.cmd = nil
			return fmt.Errorf("nook serve exited: %v (log %s)", cmd.ProcessState, s.LogPath)
		default:
		}
		if resp, err := hc.Get("http://" + s.APIAddr + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent {
				return nil
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	s.stopLocked()
	return errors.New("nook serve did not answer /health within " + timeout.String())
}

// Stop ends nook serve with SIGTERM, and SIGKILL if it has not exited
// within 15 seconds. It does nothing when nook serve is not running.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked()
}

func (s *Server) stopLocked() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(15 * time.Second):
		s.cmd.Process.Signal(syscall.SIGKILL)
		<-s.done
	}
	s.cmd = nil
}

// Kill sends SIGKILL to nook serve only (the sandboxes it started outlive
// it) and waits for it to exit.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
	s.cmd = nil
}

// PID returns nook serve's pid, 0 when it is not running.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// LogTail returns the last lines of the server's log.
func (s *Server) LogTail(lines int) string {
	data, err := os.ReadFile(s.LogPath)
	if err != nil {
		return ""
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}
