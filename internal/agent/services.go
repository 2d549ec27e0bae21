package agent

import (
	"bufio"
	"encoding/json"
	"log/slog"
	"os"
	"syscall"
	"time"
)

// Service is a long-running helper the agent starts and keeps running, such
// as nook-interp (run_code). It runs as container root with the agent's own
// (image) environment and its output goes to the agent's.
type Service struct {
	Name string
	Args []string // Args[0] is the binary's path
	// SandboxEnv hands the service the sandbox env (from /init) on fd 3:
	// each line the service writes there is answered with one JSON object
	// line holding the current sandbox env.
	SandboxEnv bool
}

// StartService starts svc and restarts it whenever it exits, backing off
// after quick failures. It returns at once; the service lives as long as
// the agent.
func (s *Server) StartService(svc Service) {
	go func() {
		backoff := 100 * time.Millisecond
		for {
			start := time.Now()
			ws, err := s.runService(svc)
			if err != nil {
				slog.Error("service failed to start", "service", svc.Name, "err", err)
			} else {
				slog.Warn("service exited; restarting", "service", svc.Name, "status", statusString(ws))
			}
			if time.Since(start) > 10*time.Second {
				backoff = 100 * time.Millisecond
			}
			time.Sleep(backoff)
			if backoff *= 2; backoff > 5*time.Second {
				backoff = 5 * time.Second
			}
		}
	}()
}

func (s *Server) runService(svc Service) (syscall.WaitStatus, error) {
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return 0, err
	}
	defer devnull.Close()
	files := []uintptr{devnull.Fd(), os.Stdout.Fd(), os.Stderr.Fd()}
	var mine *os.File
	if svc.SandboxEnv {
		fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			return 0, err
		}
		mine = os.NewFile(uintptr(fds[0]), "service-env")
		theirs := os.NewFile(uintptr(fds[1]), "service-env-child")
		defer theirs.Close()
		files = append(files, theirs.Fd())
		go s.serveSandboxEnv(mine)
	}
	attr := &syscall.ProcAttr{Dir: "/", Env: s.cfg.AgentEnv, Files: files, Sys: &syscall.SysProcAttr{Setpgid: true}}
	pid, wait, err := s.reaper.Spawn(svc.Args[0], svc.Args, attr)
	if err != nil {
		if mine != nil {
			mine.Close()
		}
		return 0, err
	}
	slog.Info("service started", "service", svc.Name, "pid", pid)
	ws := <-wait
	// Its children (kernels) die with it: they are its process group.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	if mine != nil {
		mine.Close()
	}
	return ws, nil
}

func (s *Server) serveSandboxEnv(f *os.File) {
	defer f.Close()
	r := bufio.NewReader(f)
	for {
		if _, err := r.ReadString('\n'); err != nil {
			return
		}
		s.mu.RLock()
		b, _ := json.Marshal(s.envVars)
		s.mu.RUnlock()
		if _, err := f.Write(append(b, '\n')); err != nil {
			return
		}
	}
}
