package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/agent"
)

// Signals nook sends around a memory checkpoint (gVisor's runsc checkpoint
// cannot save a listening or connected host unix socket): SIGUSR1 closes
// the agent's socket and every connection on it (the socket file goes
// away, which nook waits for); SIGUSR2 listens again (after restore).
const (
	sigCheckpoint = syscall.SIGUSR1
	sigRestored   = syscall.SIGUSR2
)

// serveCheckpointable serves srv on socket until ctx ends, closing and
// reopening the socket on sigCheckpoint / sigRestored. It starts on
// listenFD when that is a socket listening there already (nook made it, so
// its first requests wait in the backlog instead of polling for the agent).
// serving is called once, when the agent first serves.
func serveCheckpointable(ctx context.Context, srv *agent.Server, socket string, listenFD int, serving func()) error {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, sigCheckpoint, sigRestored)
	for {
		ln, err := inheritedListener(listenFD)
		listenFD = -1 // only once: after a restore the agent listens itself
		if ln == nil {
			if err != nil {
				slog.Info("no inherited listener; listening", "err", err)
			}
			if ln, err = agent.ListenUnix(socket); err != nil {
				return err
			}
		}
		conns := &connSet{m: map[net.Conn]struct{}{}}
		hs := &http.Server{Handler: srv, ReadHeaderTimeout: 30 * time.Second, ConnState: conns.track}
		errc := make(chan error, 1)
		go func() { errc <- hs.Serve(ln) }()
		if serving != nil {
			serving()
			serving = nil
		}
	wait:
		for {
			select {
			case <-ctx.Done():
				sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				hs.Shutdown(sctx)
				cancel()
				return nil
			case err := <-errc:
				if errors.Is(err, http.ErrServerClosed) {
					return nil
				}
				return err
			case s := <-sigs:
				if s == sigCheckpoint {
					break wait
				}
			}
		}
		hs.Close()
		conns.closeAll()
		<-errc
		os.Remove(socket)
		slog.Info("socket closed for a checkpoint; waiting for restore")
		for s := range sigs {
			if s == sigRestored {
				break
			}
		}
		slog.Info("restored; listening again", "socket", socket)
	}
}

// connSet tracks every connection, hijacked ones included (http.Server's
// Close leaves those open).
type connSet struct {
	mu sync.Mutex
	m  map[net.Conn]struct{}
}

func (c *connSet) track(conn net.Conn, st http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch st {
	case http.StateNew:
		c.m[conn] = struct{}{}
	case http.StateClosed:
		delete(c.m, conn)
	}
}

func (c *connSet) closeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for conn := range c.m {
		conn.Close()
	}
	c.m = map[net.Conn]struct{}{}
}

// inheritedListener returns the listening socket at fd, or nil (with the
// reason) when fd is negative or not a listening socket.
func inheritedListener(fd int) (net.Listener, error) {
	if fd < 0 {
		return nil, nil
	}
	if accepting, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || accepting != 1 {
		return nil, fmt.Errorf("fd %d is not a listening socket (%v)", fd, err)
	}
	f := os.NewFile(uintptr(fd), "listener")
	defer f.Close() // FileListener holds its own copy
	return net.FileListener(f)
}
