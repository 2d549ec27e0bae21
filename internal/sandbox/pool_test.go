package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nookhq/nook/internal/agentclient"
	"github.com/nookhq/nook/internal/runtime"
	"github.com/nookhq/nook/internal/store"
	"github.com/nookhq/nook/internal/template"
)

// fakeRuntime stands in for runc in this package's unit tests: "starting" a
// sandbox serves a minimal agent (/health, /init) on its socket.
type fakeRuntime struct {
	runDir string

	mu      sync.Mutex
	servers map[string]*http.Server
	inits   map[string][]agentclient.InitRequest
	starts  int
	// gate, when set, holds every Start until it is closed (started is
	// told first).
	gate, started chan struct{}
}

func (f *fakeRuntime) Start(_ context.Context, s runtime.Spec) error {
	f.mu.Lock()
	gate, started := f.gate, f.started
	f.mu.Unlock()
	if gate != nil {
		started <- struct{}{}
		<-gate
	}
	// Serve on the listener nook passes to PID 1, as the agent does.
	var ln net.Listener
	var err error
	if len(s.ExtraFiles) > 0 {
		ln, err = net.FileListener(s.ExtraFiles[0])
	} else {
		ln, err = net.Listen("unix", filepath.Join(f.runDir, s.ID, "agent.sock"))
	}
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("POST /init", func(w http.ResponseWriter, r *http.Request) {
		var req agentclient.InitRequest
		json.NewDecoder(r.Body).Decode(&req)
		f.mu.Lock()
		f.inits[s.ID] = append(f.inits[s.ID], req)
		f.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	f.mu.Lock()
	f.servers[s.ID] = srv
	f.starts++
	f.mu.Unlock()
	return nil
}

func (f *fakeRuntime) Stop(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if srv, ok := f.servers[id]; ok {
		srv.Close()
		delete(f.servers, id)
	}
	return nil
}

func (f *fakeRuntime) Inspect(_ context.Context, id string) (runtime.Info, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.servers[id]; !ok {
		return runtime.Info{}, runtime.ErrNotFound
	}
	return runtime.Info{ID: id, Running: true}, nil
}

func (f *fakeRuntime) List(context.Context) ([]string, error) { return nil, nil }

func newTestManager(t *testing.T, poolSize int) (*Manager, *fakeRuntime) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	reg, err := template.NewRegistry(st, dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Put(template.Template{ID: "base", State: template.StateReady, Layers: []string{dir}, DiskMB: 16}); err != nil {
		t.Fatal(err)
	}
	agent := filepath.Join(dir, "agent")
	os.WriteFile(agent, nil, 0o755)
	rt := &fakeRuntime{runDir: filepath.Join(dir, "run"), servers: map[string]*http.Server{}, inits: map[string][]agentclient.InitRequest{}}
	m, err := NewManager(Config{
		DataDir: dir, AgentPath: agent, Runtime: rt, Store: st, Templates: reg,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), PoolSize: poolSize,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.DrainPool(context.Background(), "")
		for _, sb := range m.List() {
			m.Kill(context.Background(), sb.ID)
		}
	})
	return m, rt
}

func waitPool(t *testing.T, m *Manager, want int) {
	t.Helper()
	for i := 0; i < 500 && m.PoolSizes()["base"] < want; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if got := m.PoolSizes()["base"]; got < want {
		t.Fatalf("pool has %d sandboxes, want %d", got, want)
	}
}

func TestPoolClaimInitialisesLikeACreate(t *testing.T) {
	m, rt := newTestManager(t, 2)
	if err := m.WarmPools(); err != nil {
		t.Fatal(err)
	}
	waitPool(t, m, 2)
	if n := len(m.List()); n != 0 {
		t.Fatalf("pooled sandboxes must not be listed, got %d", n)
	}
	sb, err := m.Create(context.Background(), CreateOptions{Template: "base", EnvVars: map[string]string{"A": "1"}, Metadata: map[string]string{"k": "v"}, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	rt.mu.Lock()
	inits := rt.inits[sb.ID]
	rt.mu.Unlock()
	if len(inits) != 1 || inits[0].EnvVars["A"] != "1" || inits[0].AccessToken != sb.AccessToken || sb.AccessToken == "" {
		t.Fatalf("claimed sandbox got inits %+v, want one with the create's env and token", inits)
	}
	if got, _ := m.Get(sb.ID); got.Metadata["k"] != "v" || time.Until(got.EndAt) < 50*time.Second {
		t.Fatalf("record %+v lacks the create's metadata or timeout", got)
	}
}

func TestPoolNeverHandsOutASandboxTwice(t *testing.T) {
	m, _ := newTestManager(t, 3)
	if err := m.WarmPools(); err != nil {
		t.Fatal(err)
	}
	waitPool(t, m, 3)
	const n = 24
	ids := make(chan string, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := m.Create(context.Background(), CreateOptions{Template: "base"})
			if err != nil {
				t.Error(err)
				return
			}
			ids <- sb.ID
		}()
	}
	wg.Wait()
	close(ids)
	seen := map[string]bool{}
	for id := range ids {
		if seen[id] {
			t.Fatalf("sandbox %s handed out twice", id)
		}
		seen[id] = true
	}
	if len(seen) != n {
		t.Fatalf("got %d sandboxes, want %d", len(seen), n)
	}
}

func TestNoPoolAndDisabledPoolBootNew(t *testing.T) {
	m, rt := newTestManager(t, 0)
	if err := m.WarmPools(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(context.Background(), CreateOptions{Template: "base"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	rt.mu.Lock()
	starts := rt.starts
	rt.mu.Unlock()
	if starts != 1 || len(m.PoolSizes()) != 0 {
		t.Fatalf("pool size 0 must not boot spares: %d starts, pools %v", starts, m.PoolSizes())
	}
	_, err := m.Create(context.Background(), CreateOptions{Template: "nope"})
	if err == nil || errors.Is(err, context.Canceled) {
		t.Fatalf("unknown template: got %v", err)
	}
}

// A sandbox that was booting for the pool when nook stopped is killed,
// not pooled (nothing of it may outlive the stop).
func TestStopPoolKillsABootInFlight(t *testing.T) {
	m, rt := newTestManager(t, 1)
	rt.mu.Lock()
	rt.gate, rt.started = make(chan struct{}), make(chan struct{}, 1)
	rt.mu.Unlock()
	m.WarmPools()
	<-rt.started // the refill's boot is in runtime.Start
	stopped := make(chan struct{})
	go func() {
		m.StopPool(context.Background())
		close(stopped)
	}()
	select {
	case <-stopped:
		t.Fatal("StopPool returned while a pool boot was still in flight")
	case <-time.After(100 * time.Millisecond):
	}
	close(rt.gate)
	<-stopped
	if n := m.PoolSizes()["base"]; n != 0 {
		t.Errorf("%d warm sandboxes after StopPool, want 0", n)
	}
	rt.mu.Lock()
	running := len(rt.servers)
	rt.mu.Unlock()
	if running != 0 {
		t.Errorf("%d sandboxes still running after StopPool, want 0", running)
	}
	m.WarmPools() // refills no more
	time.Sleep(50 * time.Millisecond)
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.starts != 1 {
		t.Errorf("%d boots, want only the one in flight", rt.starts)
	}
}
