// Package proxy routes sandbox traffic: requests addressed to a sandbox port
// either by Host "{port}-{id}.{domain}" or by the E2B headers E2b-Sandbox-Id
// and E2b-Sandbox-Port. The envd port goes to the sandbox's agent; any other
// port goes through the agent's tunnel to that port on the sandbox's
// loopback (HTTP, streaming and WebSocket alike).
package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"time"

	"github.com/nookhq/nook/internal/agentclient"
	"github.com/nookhq/nook/internal/agentwire"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/sandbox"
)

// Agents finds the agent of a running sandbox.
type Agents interface {
	Agent(id string) (*agentclient.Client, sandbox.Sandbox, error)
}

// Proxy is the sandbox-traffic HTTP handler.
type Proxy struct {
	Agents Agents
	Log    *slog.Logger
}

type ctxKey struct{}

type target struct {
	agent *agentclient.Client
	id    string
	port  int
}

// route finds the sandbox id and port a request is for.
func route(r *http.Request) (id string, port int, err error) {
	if id = r.Header.Get("E2b-Sandbox-Id"); id != "" {
		p := r.Header.Get("E2b-Sandbox-Port")
		if p == "" {
			p = strconv.Itoa(agentwire.EnvdPort)
		}
		port, err = strconv.Atoi(p)
		if err != nil || port < 1 || port > 65535 {
			return "", 0, fmt.Errorf("bad E2b-Sandbox-Port %q: %w", p, errdefs.ErrInvalid)
		}
		return id, port, nil
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, _, _ := strings.Cut(host, ".")
	ps, id, ok := strings.Cut(label, "-")
	if !ok {
		return "", 0, fmt.Errorf("no sandbox in Host %q (want {port}-{id}.{domain}) and no E2b-Sandbox-Id header: %w", r.Host, errdefs.ErrInvalid)
	}
	port, err = strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("bad port in Host %q: %w", r.Host, errdefs.ErrInvalid)
	}
	return id, port, nil
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]any{"code": code, "message": msg})
}

func writeJSON(w http.ResponseWriter, code int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(body)
}

// ServeHTTP routes one request.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, port, err := route(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	agent, _, err := p.Agents.Agent(id)
	if errors.Is(err, sandbox.ErrPaused) {
		agent, err = p.autoResume(r.Context(), id, err) // see resume.go
		if err != nil {
			writeError(w, http.StatusConflict, err.Error())
			return
		}
	}
	if err != nil {
		// E2B's proxy answers 502 for a sandbox that is not running, and the
		// e2b SDK's isRunning() relies on exactly that status.
		writeJSON(w, http.StatusBadGateway, map[string]any{
			"code": http.StatusBadGateway, "message": fmt.Sprintf("sandbox %q not found", id), "sandboxId": id,
		})
		return
	}
	if port == agentwire.EnvdPort && r.URL.Path == "/init" {
		// Only nook serve initialises an agent.
		writeError(w, http.StatusForbidden, "/init is reserved for the control plane")
		return
	}
	if port == agentwire.EnvdPort && strings.HasPrefix(r.URL.Path, agentwire.ControlPrefix) {
		writeError(w, http.StatusForbidden, agentwire.ControlPrefix+" is reserved for the control plane")
		return
	}
	// Streams answer while the request body may still be being relayed: an
	// HTTP/1 handler that flushes its response would otherwise lose the rest
	// of the request body, which cut streams short.
	if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
		p.Log.Debug("full duplex unavailable", "err", err)
	}
	ctx := context.WithValue(r.Context(), ctxKey{}, target{agent: agent, id: id, port: port})
	p.reverse().ServeHTTP(w, r.WithContext(ctx))
}

func (p *Proxy) reverse() *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(ctxKey{}).(target)
			pr.Out.URL.Scheme = "http"
			// The tunnel transport keeps connections per URL host: one
			// name per sandbox and port, so a connection is only ever
			// reused for the sandbox port it was dialled to.
			pr.Out.URL.Host = t.id + "-" + strconv.Itoa(t.port)
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Del("E2b-Sandbox-Id")
			pr.Out.Header.Del("E2b-Sandbox-Port")
			pr.Out.Header.Del(agentwire.LaunchEnvHeader) // only nook serve may ask for an exact env
		},
		Transport:     transport,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			t := r.Context().Value(ctxKey{}).(target)
			p.Log.Debug("sandbox port unreachable", "port", t.port, "err", err)
			writeError(w, http.StatusBadGateway, fmt.Sprintf("nothing answers on port %d of the sandbox: %v", t.port, err))
		},
	}
}

// transport sends envd requests through the sandbox agent's own pooled
// transport and any other port's requests through a fresh tunnel.
var transport http.RoundTripper = roundTripper{}

type roundTripper struct{}

func (roundTripper) RoundTrip(r *http.Request) (*http.Response, error) {
	t, ok := r.Context().Value(ctxKey{}).(target)
	if !ok {
		return nil, errors.New("no sandbox target")
	}
	if t.port == agentwire.EnvdPort {
		return t.agent.HTTP.Transport.RoundTrip(r)
	}
	return tunnelTransport.RoundTrip(r)
}

// tunnelTransport reaches other ports through the agent's CONNECT tunnel
// and keeps idle tunnels for reuse (a new one costs a socket connect, the
// CONNECT exchange and a TCP connect inside the sandbox). Requests are
// keyed by URL host "{id}-{port}" (see reverse), never shared between
// sandboxes or ports.
var tunnelTransport = &http.Transport{
	DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		t := ctx.Value(ctxKey{}).(target)
		return t.agent.DialPort(ctx, t.port)
	},
	MaxIdleConnsPerHost: 8,
	IdleConnTimeout:     30 * time.Second,
}
