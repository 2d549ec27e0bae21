// Package client is a small Go client of nook's REST API, used by the CLI.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client calls one nook server.
type Client struct {
	APIURL string // e.g. http://localhost:3000
	APIKey string
	HTTP   *http.Client
}

// Error is an error answer of the API.
type Error struct {
	Status  int
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("%s (HTTP %d)", e.Message, e.Status) }

// Do sends a JSON request and decodes a JSON answer into out (if non-nil).
func (c *Client) Do(ctx context.Context, method, path string, in, out any) (http.Header, error) {
	return c.do(ctx, method, path, in, out, nil)
}

func (c *Client) do(ctx context.Context, method, path string, in, out any, hdr http.Header) (http.Header, error) {
	var body io.Reader
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(c.APIURL, "/")+path, body)
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	req.Header.Set("X-API-Key", c.APIKey)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach nook at %s: %w", c.APIURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var e struct {
			Message string `json:"message"`
		}
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		if json.Unmarshal(data, &e) != nil || e.Message == "" {
			e.Message = strings.TrimSpace(string(data))
		}
		return resp.Header, &Error{Status: resp.StatusCode, Message: e.Message}
	}
	if out != nil && resp.StatusCode != http.StatusNoContent {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return resp.Header, fmt.Errorf("decode answer of %s %s: %w", method, path, err)
		}
	}
	return resp.Header, nil
}

// Sandbox is the API's view of a sandbox (create answer and details).
type Sandbox struct {
	SandboxID       string            `json:"sandboxID"`
	TemplateID      string            `json:"templateID"`
	Alias           string            `json:"alias,omitempty"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	StartedAt       *time.Time        `json:"startedAt,omitempty"`
	EndAt           *time.Time        `json:"endAt,omitempty"`
	CPUCount        int               `json:"cpuCount,omitempty"`
	MemoryMB        int               `json:"memoryMB,omitempty"`
	DiskSizeMB      int               `json:"diskSizeMB,omitempty"`
	Metadata        map[string]string `json:"metadata,omitempty"`
	State           string            `json:"state,omitempty"`
}

// CreateRequest is the body of a sandbox create.
type CreateRequest struct {
	TemplateID string            `json:"templateID"`
	Timeout    int64             `json:"timeout,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	EnvVars    map[string]string `json:"envVars,omitempty"`
	// NoPool asks for a newly booted sandbox even when a warm one waits.
	NoPool bool `json:"-"`
}

// Create starts a sandbox.
func (c *Client) Create(ctx context.Context, r CreateRequest) (Sandbox, error) {
	var sb Sandbox
	var hdr http.Header
	if r.NoPool {
		hdr = http.Header{"Nook-Pool": {"off"}}
	}
	_, err := c.do(ctx, http.MethodPost, "/sandboxes", r, &sb, hdr)
	return sb, err
}

// PoolSizes returns how many warm sandboxes each template has.
func (c *Client) PoolSizes(ctx context.Context) (map[string]int, error) {
	var out map[string]int
	_, err := c.Do(ctx, http.MethodGet, "/v1/pool", nil, &out)
	return out, err
}

// Get returns a sandbox's details.
func (c *Client) Get(ctx context.Context, id string) (Sandbox, error) {
	var sb Sandbox
	_, err := c.Do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id), nil, &sb)
	return sb, err
}

// List returns the running sandboxes, filtered by metadata when given.
func (c *Client) List(ctx context.Context, metadata map[string]string) ([]Sandbox, error) {
	q := url.Values{}
	if len(metadata) > 0 {
		md := url.Values{}
		for k, v := range metadata {
			md.Set(k, v)
		}
		q.Set("metadata", md.Encode())
	}
	var out []Sandbox
	path := "/v2/sandboxes"
	for {
		var page []Sandbox
		h, err := c.Do(ctx, http.MethodGet, path+"?"+q.Encode(), nil, &page)
		if err != nil {
			return nil, err
		}
		out = append(out, page...)
		next := h.Get("X-Next-Token")
		if next == "" {
			return out, nil
		}
		q.Set("nextToken", next)
	}
}

// Kill ends a sandbox.
func (c *Client) Kill(ctx context.Context, id string) error {
	_, err := c.Do(ctx, http.MethodDelete, "/sandboxes/"+url.PathEscape(id), nil, nil)
	return err
}

// SetTimeout sets a sandbox's end time to now + seconds.
func (c *Client) SetTimeout(ctx context.Context, id string, seconds int64) error {
	_, err := c.Do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/timeout", map[string]int64{"timeout": seconds}, nil)
	return err
}
