package client

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/nookhq/nook/internal/agentwire"
	"github.com/nookhq/nook/internal/envdpb/process/processconnect"
)

// Sandboxes reaches sandboxes through nook's sandbox-traffic proxy, the way
// the e2b SDK does (E2b-Sandbox-Id / E2b-Sandbox-Port headers).
type Sandboxes struct {
	ProxyURL string // e.g. http://localhost:3002
	HTTP     *http.Client
}

// headerTransport adds fixed headers to every request.
type headerTransport struct {
	base    http.RoundTripper
	headers http.Header
}

func (t headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range t.headers {
		r.Header[k] = v
	}
	return t.base.RoundTrip(r)
}

func (s *Sandboxes) base() http.RoundTripper {
	if s.HTTP != nil && s.HTTP.Transport != nil {
		return s.HTTP.Transport
	}
	return http.DefaultTransport
}

// PortClient returns an HTTP client whose requests go to port of sandbox sb,
// as user (empty: the sandbox's default user).
func (s *Sandboxes) PortClient(sb Sandbox, port int, user string) *http.Client {
	h := http.Header{}
	h.Set("E2b-Sandbox-Id", sb.SandboxID)
	h.Set("E2b-Sandbox-Port", fmt.Sprint(port))
	if sb.EnvdAccessToken != "" {
		h.Set("X-Access-Token", sb.EnvdAccessToken)
	}
	if user != "" {
		h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
	return &http.Client{Transport: headerTransport{base: s.base(), headers: h}}
}

func (s *Sandboxes) url() string { return strings.TrimRight(s.ProxyURL, "/") }

// Process returns a client of the sandbox agent's process service.
func (s *Sandboxes) Process(sb Sandbox, user string) processconnect.ProcessClient {
	return processconnect.NewProcessClient(s.PortClient(sb, agentwire.EnvdPort, user), s.url())
}

// Upload streams r into path inside the sandbox.
func (s *Sandboxes) Upload(ctx context.Context, sb Sandbox, path string, r io.Reader) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url()+"/files?path="+url.QueryEscape(path), r)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	return s.do(sb, req, io.Discard)
}

// Download streams the file at path inside the sandbox into w.
func (s *Sandboxes) Download(ctx context.Context, sb Sandbox, path string, w io.Writer) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url()+"/files?path="+url.QueryEscape(path), nil)
	if err != nil {
		return err
	}
	return s.do(sb, req, w)
}

func (s *Sandboxes) do(sb Sandbox, req *http.Request, w io.Writer) error {
	resp, err := s.PortClient(sb, agentwire.EnvdPort, "").Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return &Error{Status: resp.StatusCode, Message: strings.TrimSpace(string(msg))}
	}
	_, err = io.Copy(w, resp.Body)
	return err
}
