package sandbox

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/nookhq/nook/internal/agentclient"
)

// Probe defaults, as CubeSandbox's: 30 s timeout, 500 ms period.
const (
	DefaultProbeTimeout = 30 * time.Second
	probePeriod         = 500 * time.Millisecond
)

// Probe waits until an HTTP GET of path on the sandbox's port answers 2xx,
// reached through the agent's tunnel. It returns the last failure when
// timeout passes first.
func Probe(ctx context.Context, agent *agentclient.Client, port int, path string, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = DefaultProbeTimeout
	}
	if path == "" {
		path = "/health"
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return agent.DialPort(ctx, port) },
		DisableKeepAlives: true,
	}}
	var last error
	for {
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, "http://sandbox"+path, nil)
		resp, err := hc.Do(req)
		rcancel()
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode >= 200 && resp.StatusCode < 300 {
				return nil
			}
			err = fmt.Errorf("GET %s on port %d answered %s", path, port, resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("probe of port %d did not pass within %s: %v", port, timeout, last)
		case <-time.After(probePeriod):
		}
	}
}
