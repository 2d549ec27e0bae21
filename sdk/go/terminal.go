package nook

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// TerminalOptions are CreateTerminal's options. Env overlays the image
// environment for this terminal only (stored SetEnvVars names are not
// merged); TERM is xterm-256color unless Env sets it.
type TerminalOptions struct {
	Command    []string // default: bash (sh when the image has no bash)
	Cwd        string
	Env        Vars
	Cols, Rows int // default 80x24
	BufferSize int // bytes of output kept for replay (default 256 KiB)
}

// Terminal is a handle on a terminal.
type Terminal struct {
	sb  *Sandbox
	ID  string
	Pid uint32
}

// CreateTerminal starts an interactive program on a pseudo-terminal.
func (s *Sandbox) CreateTerminal(ctx context.Context, o *TerminalOptions) (*Terminal, error) {
	if o == nil {
		o = &TerminalOptions{}
	}
	body := map[string]any{}
	if len(o.Command) > 0 {
		body["command"] = o.Command
	}
	if o.Cwd != "" {
		body["cwd"] = o.Cwd
	}
	if o.Env != nil {
		body["env"] = o.Env
	}
	if o.Cols > 0 {
		body["cols"] = o.Cols
	}
	if o.Rows > 0 {
		body["rows"] = o.Rows
	}
	if o.BufferSize > 0 {
		body["bufferSize"] = o.BufferSize
	}
	var info Info
	if err := s.c.do(ctx, http.MethodPost, s.path("/terminals"), nil, body, &info); err != nil {
		return nil, err
	}
	return &Terminal{sb: s, ID: info.ID, Pid: info.Pid}, nil
}

// GetTerminal returns a handle on a terminal by id.
func (s *Sandbox) GetTerminal(ctx context.Context, id string) (*Terminal, error) {
	var info Info
	if err := s.c.do(ctx, http.MethodGet, s.path("/terminals/"+url.PathEscape(id)), nil, nil, &info); err != nil {
		return nil, err
	}
	return &Terminal{sb: s, ID: info.ID, Pid: info.Pid}, nil
}

// ListTerminals lists running terminals and the last 64 finished ones.
func (s *Sandbox) ListTerminals(ctx context.Context) ([]Info, error) {
	var out []Info
	err := s.c.do(ctx, http.MethodGet, s.path("/terminals"), nil, nil, &out)
	return out, err
}

func (t *Terminal) path(rest string) string {
	return t.sb.path("/terminals/" + url.PathEscape(t.ID) + rest)
}

// Info returns the terminal's details and status.
func (t *Terminal) Info(ctx context.Context) (Info, error) {
	var info Info
	err := t.sb.c.do(ctx, http.MethodGet, t.path(""), nil, nil, &info)
	return info, err
}

// Write types data into the terminal.
func (t *Terminal) Write(ctx context.Context, data []byte) error {
	resp, err := t.sb.c.request(ctx, http.MethodPost, t.path("/write"), nil, bytes.NewReader(data), "application/octet-stream")
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// Resize sets the terminal's window size.
func (t *Terminal) Resize(ctx context.Context, cols, rows int) error {
	return t.sb.c.do(ctx, http.MethodPost, t.path("/resize"), nil, map[string]int{"cols": cols, "rows": rows}, nil)
}

// Interrupt types Ctrl-C (SIGINT to the foreground job).
func (t *Terminal) Interrupt(ctx context.Context) error {
	return t.sb.c.do(ctx, http.MethodPost, t.path("/interrupt"), nil, nil, nil)
}

// Terminate hangs up the terminal's processes, killing them a second later.
func (t *Terminal) Terminate(ctx context.Context) error {
	return t.sb.c.do(ctx, http.MethodPost, t.path("/terminate"), nil, nil, nil)
}

// WaitForExit waits for the terminal's program to end.
func (t *Terminal) WaitForExit(ctx context.Context, timeout time.Duration) (Status, error) {
	q := url.Values{}
	msQuery(q, "timeout", timeout)
	var info Info
	err := t.sb.c.do(ctx, http.MethodGet, t.path("/wait"), q, nil, &info)
	return info.Status, err
}

// Output returns the buffered output (or follows it) with cursors, as
// Process.Logs does; events have Stream "pty".
func (t *Terminal) Output(ctx context.Context, o *LogsOptions, fn func(LogChunk) error) (LogChunk, error) {
	return logs(ctx, t.sb.c, t.path("/output"), o, fn)
}

// TerminalConn is a WebSocket attachment to a terminal.
type TerminalConn struct {
	c *websocket.Conn
	// End is the terminal's final status once Read returned io.EOF because
	// it exited.
	End *Status
}

// AttachOptions choose what an attachment replays: by default all buffered
// output; Since a cursor; or NoReplay for only new output.
type AttachOptions struct {
	Since    *uint64
	NoReplay bool
}

// Attach opens a WebSocket on the terminal; it first replays the buffered
// output, then streams live output.
func (t *Terminal) Attach(ctx context.Context, o *AttachOptions) (*TerminalConn, error) {
	u := t.sb.c.BaseURL + t.path("/ws")
	u = "ws" + strings.TrimPrefix(u, "http")
	q := url.Values{}
	if o != nil && o.Since != nil {
		q.Set("since", strconv.FormatUint(*o.Since, 10))
	}
	if o != nil && o.NoReplay {
		q.Set("replay", "false")
	}
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	h := http.Header{}
	h.Set("X-API-Key", t.sb.c.APIKey)
	c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: h, HTTPClient: t.sb.c.HTTP})
	if err != nil {
		if resp != nil && resp.StatusCode >= 300 {
			return nil, &Error{StatusCode: resp.StatusCode, Message: err.Error()}
		}
		return nil, err
	}
	c.SetReadLimit(8 << 20)
	return &TerminalConn{c: c}, nil
}

// Read returns the next chunk of terminal output; io.EOF once the terminal
// exited (End is then set) or the attachment closed normally.
func (tc *TerminalConn) Read(ctx context.Context) ([]byte, error) {
	for {
		typ, data, err := tc.c.Read(ctx)
		if err != nil {
			if websocket.CloseStatus(err) == websocket.StatusNormalClosure {
				return nil, io.EOF
			}
			return nil, err
		}
		if typ == websocket.MessageBinary {
			return data, nil
		}
		var m struct {
			Type   string  `json:"type"`
			Status *Status `json:"status"`
		}
		if json.Unmarshal(data, &m) == nil && m.Type == "exit" {
			tc.End = m.Status
		}
	}
}

// Write sends input to the terminal.
func (tc *TerminalConn) Write(ctx context.Context, data []byte) error {
	return tc.c.Write(ctx, websocket.MessageBinary, data)
}

// Resize sets the terminal's window size.
func (tc *TerminalConn) Resize(ctx context.Context, cols, rows int) error {
	data, _ := json.Marshal(map[string]any{"type": "resize", "cols": cols, "rows": rows})
	return tc.c.Write(ctx, websocket.MessageText, data)
}

// Close detaches; the terminal keeps running.
func (tc *TerminalConn) Close() error { return tc.c.Close(websocket.StatusNormalClosure, "detach") }
