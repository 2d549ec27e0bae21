// Package agentclient is nook serve's side of the agent contract
// (internal/agentwire): it reaches a sandbox's agent over its unix socket,
// waits for it, initialises it and opens tunnels to the sandbox's ports.
package agentclient

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Client talks to one sandbox's agent.
type Client struct {
	Socket string
	HTTP   *http.Client
}

// New returns a client for the agent listening on socket.
func New(socket string) *Client {
	c := &Client{Socket: socket}
	c.HTTP = &http.Client{Transport: c.Transport()}
	return c
}

// Dial connects to the agent's socket. The socket's directory is writable
// by the sandbox's root, which could put a symlink to any host socket in its
// place; so the socket is opened without following a symlink, checked to be
// a socket, and connected to through that very inode (/proc/self/fd/N).
func (c *Client) Dial(ctx context.Context) (net.Conn, error) {
	fd, err := unix.Open(c.Socket, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "unix", Err: fmt.Errorf("open %s: %w", c.Socket, err)}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("agent socket %s is not a socket (mode %o): refusing to connect", c.Socket, st.Mode)
	}
	var d net.Dialer
	return d.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
}

// Transport is an HTTP transport whose every connection goes to the agent.
func (c *Client) Transport() *http.Transport {
	return &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return c.Dial(ctx) },
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     30 * time.Second,
	}
}

// WaitReady polls the agent's /health until it answers or ctx ends. The
// agent listens within milliseconds of its start, so it is polled often
// (every millisecond at most; a miss is one failed open of the socket path).
func (c *Client) WaitReady(ctx context.Context) error {
	delay := 200 * time.Microsecond
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent/health", nil)
		resp, err := c.HTTP.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode < 300 {
				return nil
			}
			err = fmt.Errorf("health: %s", resp.Status)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent not ready: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(delay):
		}
		if delay < time.Millisecond {
			delay *= 2
		}
	}
}

// InitRequest is the body of envd's POST /init.
type InitRequest struct {
	EnvVars        map[string]string `json:"envVars,omitempty"`
	AccessToken    string            `json:"accessToken,omitempty"`
	DefaultUser    string            `json:"defaultUser,omitempty"`
	DefaultWorkdir string            `json:"defaultWorkdir,omitempty"`
	Timestamp      string            `json:"timestamp,omitempty"`
}

// Init sends the sandbox-wide settings to the agent.
func (c *Client) Init(ctx context.Context, r InitRequest) error {
	body, err := json.Marshal(r)
	if err != nil {
		return err
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://agent/init", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("agent init: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("agent init: %s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}

// DialPort opens a TCP stream to port on the sandbox's own loopback,
// through the agent's CONNECT tunnel.
func (c *Client) DialPort(ctx context.Context, port int) (net.Conn, error) {
	conn, err := c.Dial(ctx)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	target := fmt.Sprintf("127.0.0.1:%d", port)
	if _, err := fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target); err != nil {
		conn.Close()
		return nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("tunnel to port %d: %w", port, err)
	}
	if resp.StatusCode != http.StatusOK {
		conn.Close()
		return nil, fmt.Errorf("tunnel to port %d: %s", port, resp.Status)
	}
	conn.SetDeadline(time.Time{})
	if br.Buffered() > 0 {
		return &bufferedConn{Conn: conn, r: br}, nil
	}
	return conn, nil
}

type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }
