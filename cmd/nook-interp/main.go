// Command nook-interp is nook's code interpreter: it serves the E2B
// code-interpreter protocol (/execute, /contexts, /health) on
// 127.0.0.1:49999 inside a sandbox, on Jupyter (Python), Node (JavaScript)
// and Bash kernels. nook-agent starts it as a service, with the image env,
// when the sandbox's template has an interpreter; it is bind-mounted
// read-only beside the agent and, like it, is a static binary.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nookhq/nook/internal/interp"
)

func main() {
	fs := flag.NewFlagSet("nook-interp", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:49999", "address to serve the code-interpreter protocol on")
	user := fs.String("user", "user", "user the kernels run as (root when it does not exist)")
	cwd := fs.String("cwd", "", "working directory of new contexts (default: the user's home)")
	warm := fs.String("warm", "python", "comma list of languages whose default context starts at once (the first gates /health)")
	envFD := fs.Int("sandbox-env-fd", -1, "a socket on which the agent answers each line with the sandbox env as JSON (run-code env inheritance)")
	stateDir := fs.String("state-dir", "/tmp/.nook-interp", "directory for kernels' connection files and cells")
	verbose := fs.Bool("v", false, "debug logging")
	_ = fs.Parse(os.Args[1:])
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("service", "nook-interp")
	slog.SetDefault(log)

	u, err := interp.LookupUser("/etc/passwd", *user)
	if err != nil {
		log.Info("kernels run as root", "reason", err)
		u = nil
	}
	if err := os.MkdirAll(*stateDir, 0o711); err != nil {
		log.Error("state dir", "err", err)
		os.Exit(1)
	}
	cfg := interp.Config{Env: os.Environ(), User: u, DefaultCwd: *cwd, StateDir: *stateDir, Log: log}
	if *envFD >= 0 {
		cfg.SandboxEnv = sandboxEnv(os.NewFile(uintptr(*envFD), "sandbox-env"))
	}
	srv := interp.New(cfg)
	var langs []string
	for _, l := range strings.Split(*warm, ",") {
		if l = strings.TrimSpace(l); l != "" {
			langs = append(langs, l)
		}
	}

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Error("listen", "err", err)
		os.Exit(1)
	}
	srv.Warm(langs...)
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 30 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	log.Info("nook-interp listening", "addr", ln.Addr().String(), "warm", langs)
	err = hs.Serve(ln)
	srv.Close()
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("serve", "err", err)
		os.Exit(1)
	}
}

// sandboxEnv asks the agent for the sandbox env over f (see
// agent.Service.SandboxEnv).
func sandboxEnv(f *os.File) func() (map[string]string, error) {
	var mu sync.Mutex
	r := bufio.NewReader(f)
	return func() (map[string]string, error) {
		mu.Lock()
		defer mu.Unlock()
		if _, err := f.Write([]byte("\n")); err != nil {
			return nil, fmt.Errorf("ask the agent for the sandbox env: %w", err)
		}
		line, err := r.ReadBytes('\n')
		if err != nil {
			return nil, fmt.Errorf("read the sandbox env: %w", err)
		}
		m := map[string]string{}
		if err := json.Unmarshal(line, &m); err != nil {
			return nil, err
		}
		return m, nil
	}
}
