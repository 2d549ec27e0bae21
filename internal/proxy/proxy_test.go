package proxy

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nookhq/nook/internal/agentclient"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/sandbox"
)

type oneAgent struct{ c *agentclient.Client }

func (a oneAgent) Agent(id string) (*agentclient.Client, sandbox.Sandbox, error) {
	if id != "sb1" {
		return nil, sandbox.Sandbox{}, errdefs.ErrNotFound
	}
	return a.c, sandbox.Sandbox{ID: id}, nil
}

// streamingAgent answers like envd's Start: a first event, a pause, the end.
func streamingAgent(t *testing.T) *agentclient.Client {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/connect+json")
		io.WriteString(w, "start;")
		w.(http.Flusher).Flush()
		time.Sleep(2 * time.Millisecond)
		io.WriteString(w, "end;")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return agentclient.New(sock)
}

// TestStreamsSurviveConnectionReuse sends many streamed requests in a row
// through the proxy; each must arrive whole (a reused agent connection once
// cut streams short).
func TestStreamsSurviveConnectionReuse(t *testing.T) {
	p := &Proxy{Agents: oneAgent{streamingAgent(t)}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	front := httptest.NewServer(p)
	defer front.Close()
	for i := 0; i < 300; i++ {
		req, _ := http.NewRequest(http.MethodPost, front.URL+"/process.Process/Start", bytes.NewReader([]byte(`{"x":1}`)))
		req.Header.Set("E2b-Sandbox-Id", "sb1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(body) != "start;end;" {
			t.Fatalf("request %d: body %q, err %v", i, body, err)
		}
	}
}

func TestUnknownSandboxAndReservedPaths(t *testing.T) {
	p := &Proxy{Agents: oneAgent{streamingAgent(t)}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, tc := range []struct {
		id, path string
		want     int
	}{
		{"nope", "/health", http.StatusBadGateway},
		{"sb1", "/init", http.StatusForbidden},
	} {
		req := httptest.NewRequest(http.MethodPost, tc.path, strings.NewReader("{}"))
		req.Header.Set("E2b-Sandbox-Id", tc.id)
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, req)
		if rec.Code != tc.want || !strings.Contains(rec.Body.String(), `"message"`) {
			t.Errorf("%s %s: %d %s, want %d with a JSON message", tc.id, tc.path, rec.Code, rec.Body, tc.want)
		}
	}
}

func TestRouteByHost(t *testing.T) {
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Host = "8080-sb1.nook.example:3002"
	id, port, err := route(req)
	if err != nil || id != "sb1" || port != 8080 {
		t.Fatalf("route: %q %d %v", id, port, err)
	}
	req.Host = "localhost:3002"
	if _, _, err := route(req); err == nil {
		t.Fatal("a Host without a sandbox must not route")
	}
}
