// Package nook is the Go SDK of nook's native API: sandboxes addressed by
// names you choose, exec with process handles, setEnvVars and terminals,
// with the semantics of Cloudflare's Sandbox SDK 1.0.
//
//	c := nook.NewClient("http://localhost:3000", apiKey)
//	sb, _ := c.GetSandbox(ctx, "my-app", "user-123")
//	_ = sb.SetEnvVars(ctx, nook.Vars{"NODE_ENV": nook.Str("production")})
//	p, _ := sb.Exec(ctx, []string{"node", "-v"}, nil)
//	out, _ := p.Output(ctx, nil)
//
// Each exec and terminal is an independent process: its environment is the
// sandbox's image environment, then (exec only) the names stored with
// SetEnvVars, then the launch's Env, where a nil value removes a name for
// that launch. Stored names live in nook serve's memory only.
package nook

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client calls one nook server's API.
type Client struct {
	BaseURL string // e.g. http://localhost:3000
	APIKey  string
	HTTP    *http.Client
}

// NewClient returns a client of the nook API at baseURL.
func NewClient(baseURL, apiKey string) *Client {
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), APIKey: apiKey, HTTP: &http.Client{}}
}

// Error is an error answer of the API.
type Error struct {
	StatusCode int
	Message    string
}

func (e *Error) Error() string { return fmt.Sprintf("nook: %s (HTTP %d)", e.Message, e.StatusCode) }

// IsNotFound reports whether err is a 404 of the API (unknown sandbox,
// process or terminal).
func IsNotFound(err error) bool { return statusOf(err) == http.StatusNotFound }

// IsConflict reports whether err is a 409 (e.g. a kill of a finished process).
func IsConflict(err error) bool { return statusOf(err) == http.StatusConflict }

// IsInvalid reports whether err is a 400 (bad input, e.g. an invalid name).
func IsInvalid(err error) bool { return statusOf(err) == http.StatusBadRequest }

// IsTimeout reports whether err is a wait that timed out (504).
func IsTimeout(err error) bool { return statusOf(err) == http.StatusGatewayTimeout }

func statusOf(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.StatusCode
	}
	return 0
}

func (c *Client) request(ctx context.Context, method, path string, q url.Values, body io.Reader, ctype string) (*http.Response, error) {
	u := c.BaseURL + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-API-Key", c.APIKey)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		var e struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(data, &e) != nil || e.Message == "" {
			e.Message = strings.TrimSpace(string(data))
		}
		return nil, &Error{StatusCode: resp.StatusCode, Message: e.Message}
	}
	return resp, nil
}

// do sends in as JSON (when non-nil) and decodes the answer into out.
func (c *Client) do(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	ctype := ""
	if in != nil {
		data, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body, ctype = bytes.NewReader(data), "application/json"
	}
	resp, err := c.request(ctx, method, path, q, body, ctype)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out != nil && resp.StatusCode != http.StatusNoContent {
		return json.NewDecoder(resp.Body).Decode(out)
	}
	return nil
}

// ---- sandboxes ----

// SandboxOptions are used when GetSandbox creates the sandbox.
type SandboxOptions struct {
	Template string        // default: the server's default template ("base")
	Timeout  time.Duration // lifetime, renewed on every GetSandbox; default 30 min
}

// Sandbox is a handle on one sandbox.
type Sandbox struct {
	c          *Client
	ID         string
	Namespace  string
	Name       string
	TemplateID string
	// Created is true when this GetSandbox call created the sandbox.
	Created bool
}

// GetSandbox returns the sandbox named name in namespace ns: the first use
// creates it, later uses reach the same one. Names are 1-63 letters,
// digits, '.', '_' or '-'.
func (c *Client) GetSandbox(ctx context.Context, ns, name string, opts ...SandboxOptions) (*Sandbox, error) {
	var o SandboxOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	body := map[string]any{}
	if o.Template != "" {
		body["template"] = o.Template
	}
	if o.Timeout > 0 {
		body["timeout"] = int64((o.Timeout + time.Second - 1) / time.Second)
	}
	var out struct {
		ID         string `json:"id"`
		Namespace  string `json:"namespace"`
		Name       string `json:"name"`
		TemplateID string `json:"templateID"`
		Created    bool   `json:"created"`
	}
	if err := c.do(ctx, http.MethodPut, "/v1/namespaces/"+url.PathEscape(ns)+"/sandboxes/"+url.PathEscape(name), nil, body, &out); err != nil {
		return nil, err
	}
	return &Sandbox{c: c, ID: out.ID, Namespace: out.Namespace, Name: out.Name, TemplateID: out.TemplateID, Created: out.Created}, nil
}

// SandboxByID returns a handle on any running sandbox by its id (for
// example one created through the E2B API).
func (c *Client) SandboxByID(id string) *Sandbox { return &Sandbox{c: c, ID: id} }

func (s *Sandbox) path(rest string) string { return "/v1/sandboxes/" + url.PathEscape(s.ID) + rest }

// Destroy kills the sandbox and forgets everything of it.
func (s *Sandbox) Destroy(ctx context.Context) error {
	return s.c.do(ctx, http.MethodDelete, s.path(""), nil, nil, nil)
}

// Vars is a set of environment variables for SetEnvVars and launch envs:
// a nil value removes the name.
type Vars map[string]*string

// Str returns a pointer to v, for Vars values.
func Str(v string) *string { return &v }

// SetEnvVars stores names for later Exec launches (nil removes a stored
// name). It returns the stored names afterwards.
func (s *Sandbox) SetEnvVars(ctx context.Context, vars Vars) (map[string]string, error) {
	var out map[string]string
	err := s.c.do(ctx, http.MethodPost, s.path("/env"), nil, vars, &out)
	return out, err
}

// EnvVars returns the names stored with SetEnvVars.
func (s *Sandbox) EnvVars(ctx context.Context) (map[string]string, error) {
	var out map[string]string
	err := s.c.do(ctx, http.MethodGet, s.path("/env"), nil, nil, &out)
	return out, err
}

// ---- processes ----

// ExecOptions are Exec's options.
type ExecOptions struct {
	Cwd string
	Env Vars
	// Timeout, when set, sends SIGTERM to the process group after it and
	// SIGKILL a second later.
	Timeout time.Duration
}

// Status is a process's or terminal's state: State "running", "exited"
// (ExitCode, or Signal when a signal ended it) or "error".
type Status struct {
	State      string     `json:"state"`
	ExitCode   *int       `json:"exitCode,omitempty"`
	Signal     *int       `json:"signal,omitempty"`
	SignalName string     `json:"signalName,omitempty"`
	TimedOut   bool       `json:"timedOut"`
	Error      string     `json:"error,omitempty"`
	StartedAt  time.Time  `json:"startedAt"`
	EndedAt    *time.Time `json:"endedAt,omitempty"`
}

// Running reports whether the process still runs.
func (s Status) Running() bool { return s.State == "running" }

// Info describes a process or terminal.
type Info struct {
	ID      string   `json:"id"`
	Pid     uint32   `json:"pid"`
	Command []string `json:"command"`
	Cwd     string   `json:"cwd,omitempty"`
	Status
	Cursor uint64 `json:"cursor"`
	Cols   int    `json:"cols,omitempty"`
	Rows   int    `json:"rows,omitempty"`
}

// Process is a handle on an exec'd process.
type Process struct {
	sb  *Sandbox
	ID  string
	Pid uint32
}

// Exec starts argv and returns once it has launched.
func (s *Sandbox) Exec(ctx context.Context, argv []string, o *ExecOptions) (*Process, error) {
	if o == nil {
		o = &ExecOptions{}
	}
	body := map[string]any{"command": argv}
	if o.Cwd != "" {
		body["cwd"] = o.Cwd
	}
	if o.Env != nil {
		body["env"] = o.Env
	}
	if o.Timeout > 0 {
		body["timeout"] = o.Timeout.Milliseconds()
	}
	var info Info
	if err := s.c.do(ctx, http.MethodPost, s.path("/processes"), nil, body, &info); err != nil {
		return nil, err
	}
	return &Process{sb: s, ID: info.ID, Pid: info.Pid}, nil
}

// GetProcess returns a handle on a process by id (404 once forgotten).
func (s *Sandbox) GetProcess(ctx context.Context, id string) (*Process, error) {
	var info Info
	if err := s.c.do(ctx, http.MethodGet, s.path("/processes/"+url.PathEscape(id)), nil, nil, &info); err != nil {
		return nil, err
	}
	return &Process{sb: s, ID: info.ID, Pid: info.Pid}, nil
}

// ListProcesses lists running processes and the last 64 finished ones.
func (s *Sandbox) ListProcesses(ctx context.Context) ([]Info, error) {
	var out []Info
	err := s.c.do(ctx, http.MethodGet, s.path("/processes"), nil, nil, &out)
	return out, err
}

func (p *Process) path(rest string) string {
	return p.sb.path("/processes/" + url.PathEscape(p.ID) + rest)
}

// Info returns the process's details and status.
func (p *Process) Info(ctx context.Context) (Info, error) {
	var info Info
	err := p.sb.c.do(ctx, http.MethodGet, p.path(""), nil, nil, &info)
	return info, err
}

// Status returns the process's status.
func (p *Process) Status(ctx context.Context) (Status, error) {
	info, err := p.Info(ctx)
	return info.Status, err
}

// Kill sends sig (0: SIGTERM) to the process group. Killing a finished
// process is an error (IsConflict).
func (p *Process) Kill(ctx context.Context, sig int) error {
	return p.sb.c.do(ctx, http.MethodPost, p.path("/kill"), nil, map[string]int{"signal": sig}, nil)
}

func msQuery(q url.Values, name string, d time.Duration) {
	if d > 0 {
		q.Set(name, strconv.FormatInt(d.Milliseconds(), 10))
	}
}

// WaitForExit waits for the process to end (timeout 0: no limit; a timeout
// is an IsTimeout error).
func (p *Process) WaitForExit(ctx context.Context, timeout time.Duration) (Status, error) {
	q := url.Values{}
	msQuery(q, "timeout", timeout)
	var info Info
	err := p.sb.c.do(ctx, http.MethodGet, p.path("/wait"), q, nil, &info)
	return info.Status, err
}

// OutputOptions bound Output.
type OutputOptions struct {
	MaxBytes int
	Timeout  time.Duration
}

// Output is the result of a finished process.
type Output struct {
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	ExitCode   *int   `json:"exitCode"`
	Signal     *int   `json:"signal"`
	SignalName string `json:"signalName,omitempty"`
	TimedOut   bool   `json:"timedOut"`
	// Truncated is true when output was cut at MaxBytes or dropped by
	// retention (1 MiB / 10k events per process).
	Truncated bool `json:"truncated"`
}

// Output waits for the process to end and returns its output.
func (p *Process) Output(ctx context.Context, o *OutputOptions) (Output, error) {
	q := url.Values{}
	if o != nil {
		if o.MaxBytes > 0 {
			q.Set("maxBytes", strconv.Itoa(o.MaxBytes))
		}
		msQuery(q, "timeout", o.Timeout)
	}
	var out Output
	err := p.sb.c.do(ctx, http.MethodGet, p.path("/output"), q, nil, &out)
	return out, err
}

// LogMatch is a line that matched WaitForLog.
type LogMatch struct {
	Line   string   `json:"line"`
	Stream string   `json:"stream"`
	Groups []string `json:"groups"`
	Cursor uint64   `json:"cursor"`
}

// WaitForLog waits for a line of output matching pattern (a Go regexp) on
// stream ("stdout", "stderr" or "" for both). It fails (IsConflict) when the
// process ends first.
func (p *Process) WaitForLog(ctx context.Context, pattern, stream string, timeout time.Duration) (LogMatch, error) {
	q := url.Values{"pattern": {pattern}}
	if stream != "" {
		q.Set("stream", stream)
	}
	msQuery(q, "timeout", timeout)
	var m LogMatch
	err := p.sb.c.do(ctx, http.MethodGet, p.path("/wait-for-log"), q, nil, &m)
	return m, err
}

// WaitForPort waits until something accepts TCP connections on port in the
// sandbox. It fails (IsConflict) when the process ends first.
func (p *Process) WaitForPort(ctx context.Context, port int, timeout time.Duration) error {
	q := url.Values{"port": {strconv.Itoa(port)}}
	msQuery(q, "timeout", timeout)
	return p.sb.c.do(ctx, http.MethodGet, p.path("/wait-for-port"), q, nil, nil)
}

// LogEvent is one chunk of output; Cursor addresses it.
type LogEvent struct {
	Cursor uint64    `json:"cursor"`
	Stream string    `json:"stream"` // stdout, stderr, or pty for terminals
	Data   []byte    `json:"data"`
	Time   time.Time `json:"time"`
}

// LogsOptions select log events. Without Since, Replay (the default,
// unless NoReplay) starts at the oldest retained event; NoReplay only
// shows new ones. Follow streams until the process ends.
type LogsOptions struct {
	Since    *uint64
	NoReplay bool
	Follow   bool
	Stream   string
}

// LogChunk is a batch of events; Cursor continues after it (pass it as
// Since); Gap is true when events after Since were dropped by retention;
// End is set once the process ended.
type LogChunk struct {
	Events []LogEvent `json:"events"`
	Cursor uint64     `json:"cursor"`
	Gap    bool       `json:"gap,omitempty"`
	End    *Status    `json:"end,omitempty"`
}

func logsQuery(o *LogsOptions) url.Values {
	q := url.Values{}
	if o == nil {
		return q
	}
	if o.Since != nil {
		q.Set("since", strconv.FormatUint(*o.Since, 10))
	}
	if o.NoReplay {
		q.Set("replay", "false")
	}
	if o.Follow {
		q.Set("follow", "true")
	}
	if o.Stream != "" {
		q.Set("stream", o.Stream)
	}
	return q
}

// Logs returns the retained log events (without Follow), or calls fn for
// every chunk until the process ends (with Follow). fn may be nil without
// Follow. The returned chunk is the last one.
func (p *Process) Logs(ctx context.Context, o *LogsOptions, fn func(LogChunk) error) (LogChunk, error) {
	return logs(ctx, p.sb.c, p.path("/logs"), o, fn)
}

func logs(ctx context.Context, c *Client, path string, o *LogsOptions, fn func(LogChunk) error) (LogChunk, error) {
	resp, err := c.request(ctx, http.MethodGet, path, logsQuery(o), nil, "")
	if err != nil {
		return LogChunk{}, err
	}
	defer resp.Body.Close()
	var last LogChunk
	if o == nil || !o.Follow {
		if err := json.NewDecoder(resp.Body).Decode(&last); err != nil {
			return LogChunk{}, err
		}
		if fn != nil {
			err = fn(last)
		}
		return last, err
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 8<<20)
	for sc.Scan() {
		var ch LogChunk
		if err := json.Unmarshal(sc.Bytes(), &ch); err != nil {
			return last, err
		}
		last = ch
		if fn != nil {
			if err := fn(ch); err != nil {
				return last, err
			}
		}
		if ch.End != nil {
			return last, nil
		}
	}
	if err := sc.Err(); err != nil {
		return last, err
	}
	return last, nil
}
