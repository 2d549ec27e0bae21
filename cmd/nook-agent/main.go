// Command nook-agent is the in-sandbox agent of nook. It runs as the
// sandbox's PID 1, reaps zombies, optionally starts the sandbox's main
// process, and serves the envd protocol on a unix socket.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/agentwire"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == agentwire.SeccompExecCmd {
		os.Args = seccompExec(os.Args[2:]) // seccomp.go
	}
	fs := flag.NewFlagSet("nook-agent", flag.ExitOnError)
	socket := fs.String(agentwire.SocketFlag, agent.DefaultSocket, "unix socket to serve on")
	listenFD := fs.Int(agentwire.ListenFDFlag, -1, "file descriptor already listening at --socket (from nook); the agent listens itself when it is not one")
	startCwd := fs.String(agentwire.StartCwdFlag, "", "working directory of the start command")
	startUser := fs.String(agentwire.StartUserFlag, "", "user of the start command (name, uid or uid:gid)")
	inherit := fs.Bool("envd-inherit-image-env", false, "envd processes start from the agent's full environment instead of PATH only")
	defUser := fs.String("default-user", "", "default user until /init sets one (default: user if it exists, else root)")
	defWorkdir := fs.String("default-workdir", "", "default working directory until /init sets one")
	verbose := fs.Bool("v", false, "debug logging")
	interp := fs.Bool(agentwire.CodeInterpreterFlag, false, "run "+agentwire.InterpPath+" (run_code on port 49999) as a service")
	interpEnv := fs.Bool(agentwire.RunCodeInheritEnvFlag, false, "run_code also sees the sandbox env")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: nook-agent [flags] [-- START_CMD ARGS...]\n")
		fs.PrintDefaults()
	}
	_ = fs.Parse(os.Args[1:])
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)

	reaper := agent.NewReaper()
	srv := agent.New(agent.Config{
		AgentEnv:        os.Environ(),
		InheritImageEnv: *inherit,
		DefaultUser:     *defUser,
		DefaultWorkdir:  *defWorkdir,
		Reaper:          reaper,
	})

	if *interp {
		srv.StartService(agent.Service{Name: "nook-interp", Args: interpArgs(*interpEnv), SandboxEnv: *interpEnv})
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var (
		mu       sync.Mutex
		mainPID  int
		mainDone <-chan struct{}
	)
	if args := fs.Args(); len(args) > 0 {
		pid, done, err := srv.StartMain(args, *startCwd, *startUser)
		if err != nil {
			slog.Error("start command failed", "cmd", args[0], "err", err)
		} else {
			slog.Info("start command started", "pid", pid, "cmd", args[0])
			mu.Lock()
			mainPID, mainDone = pid, done
			mu.Unlock()
		}
	}

	go func() {
		stopping := false
		for sig := range sigs {
			mu.Lock()
			pid, done := mainPID, mainDone
			mu.Unlock()
			running := false
			if done != nil {
				select {
				case <-done:
				default:
					running = true
				}
			}
			if !running {
				slog.Info("signal received, exiting", "signal", sig)
				cancel()
				return
			}
			slog.Info("forwarding signal to start command", "signal", sig, "pid", pid)
			// The start command leads its own process group: signal all of it.
			if err := syscall.Kill(-pid, sig.(syscall.Signal)); err != nil {
				_ = syscall.Kill(pid, sig.(syscall.Signal))
			}
			if !stopping {
				stopping = true
				go func() {
					<-done
					slog.Info("start command exited after signal, exiting")
					cancel()
				}()
			}
		}
	}()

	slog.Info("nook-agent listening", "socket", *socket, "version", agentwire.EnvdVersion)
	// The threads are made once the agent serves: nook's first request
	// is already waiting, and making 16 threads on two cores delays it.
	serving := func() { go warmThreads(16) }
	if err := serveCheckpointable(ctx, srv, *socket, *listenFD, serving); err != nil { // checkpoint.go
		slog.Error("serve", "err", err)
		os.Exit(1)
	}
}

// interpArgs is nook-interp's command line (see cmd/nook-interp).
func interpArgs(inheritEnv bool) []string {
	args := []string{agentwire.InterpPath, "--listen", fmt.Sprintf("127.0.0.1:%d", agentwire.CodeInterpreterPort)}
	if inheritEnv {
		args = append(args, "--sandbox-env-fd", "3")
	}
	return args
}
