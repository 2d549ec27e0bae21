package agentclient

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

func serveHealth(t *testing.T, sock string, hits *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusNoContent)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

func TestDialReachesTheSocket(t *testing.T) {
	dir := t.TempDir()
	var hits atomic.Int32
	serveHealth(t, filepath.Join(dir, "agent.sock"), &hits)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := New(filepath.Join(dir, "agent.sock")).WaitReady(ctx); err != nil || hits.Load() == 0 {
		t.Fatalf("WaitReady: %v (hits %d)", err, hits.Load())
	}
}

// The sandbox owns the socket's directory: a symlink it puts there must
// never lead nook to another (host) socket.
func TestDialRefusesASymlinkedSocket(t *testing.T) {
	host, run := t.TempDir(), t.TempDir()
	var hits atomic.Int32
	serveHealth(t, filepath.Join(host, "host.sock"), &hits)
	link := filepath.Join(run, "agent.sock")
	if err := os.Symlink(filepath.Join(host, "host.sock"), link); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := New(link).WaitReady(ctx); err == nil {
		t.Fatal("WaitReady through a symlink succeeded")
	}
	if conn, err := New(link).Dial(context.Background()); err == nil {
		conn.Close()
		t.Fatal("Dial followed a symlink")
	}
	if hits.Load() != 0 {
		t.Fatalf("the host socket was reached %d times", hits.Load())
	}
}
