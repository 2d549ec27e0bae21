package native

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/runtime"
)

// OCI exec WebSocket protocol (nook exec):
//
//	client -> nook  first frame, text: OCIExecRequest
//	nook -> client  text {"type":"started"} once running, or {"type":"error","message"}
//	client -> nook  binary: stdin bytes; text {"type":"resize","cols","rows"} or {"type":"eof"}
//	nook -> client  binary: one byte stream id (1 stdout, 2 stderr) then data
//	nook -> client  text {"type":"exit","exitCode":N} last, then a normal close
const (
	StreamStdout = 1
	StreamStderr = 2
)

// OCIExecRequest starts an OCI exec.
type OCIExecRequest struct {
	Command []string `json:"command"`
	TTY     bool     `json:"tty"`
	Stdin   bool     `json:"stdin"`
	Cwd     string   `json:"cwd,omitempty"`
	User    string   `json:"user,omitempty"`
	Cols    uint16   `json:"cols,omitempty"`
	Rows    uint16   `json:"rows,omitempty"`
	// Term is the client terminal's TERM, passed with TTY only (a terminal
	// setting, not an environment layer).
	Term string `json:"term,omitempty"`
}

// OCIExecMessage is a text frame of the OCI exec WebSocket.
type OCIExecMessage struct {
	Type     string `json:"type"`
	Message  string `json:"message,omitempty"`
	ExitCode int    `json:"exitCode"`
	Cols     uint16 `json:"cols,omitempty"`
	Rows     uint16 `json:"rows,omitempty"`
}

// ServeOCIExec runs a command in sandbox id's namespaces with the runtime
// (runc exec), not through the agent, bridged over a WebSocket. It sees
// the image env only.
func (s *Service) ServeOCIExec(w http.ResponseWriter, r *http.Request, id string) error {
	if s.Execer == nil {
		return fmt.Errorf("this runtime cannot exec into sandboxes: %w", errdefs.ErrUnavailable)
	}
	rec, err := s.Sandboxes.Get(id)
	if err != nil {
		return err
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		return nil
	}
	defer c.CloseNow()
	c.SetReadLimit(1 << 20)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	fail := func(msg string) error {
		data, _ := json.Marshal(OCIExecMessage{Type: "error", Message: msg})
		_ = c.Write(ctx, websocket.MessageText, data)
		return c.Close(websocket.StatusNormalClosure, "")
	}
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	typ, data, err := c.Read(rctx)
	rcancel()
	if err != nil {
		return nil
	}
	var req OCIExecRequest
	if typ != websocket.MessageText || json.Unmarshal(data, &req) != nil {
		return fail("the first frame must be a JSON exec request")
	}
	if len(req.Command) == 0 || req.Command[0] == "" {
		return fail("a command is required")
	}
	spec := runtime.ExecSpec{Args: req.Command, Cwd: req.Cwd, User: req.User, TTY: req.TTY, Cols: req.Cols, Rows: req.Rows}
	if spec.Cwd == "" {
		if tpl, err := s.Templates.Get(rec.TemplateID); err == nil {
			spec.Cwd = tpl.WorkingDir
		}
	}
	if req.TTY {
		term := req.Term
		if term == "" {
			term = "xterm"
		}
		spec.Env = []string{"TERM=" + term}
	}
	proc, err := s.Execer.Exec(ctx, id, spec, req.Stdin)
	if err != nil {
		return fail(err.Error())
	}
	var killOnce sync.Once
	kill := func() { killOnce.Do(func() { _ = proc.Kill() }) }
	started, _ := json.Marshal(OCIExecMessage{Type: "started"})
	if err := c.Write(ctx, websocket.MessageText, started); err != nil {
		kill()
		proc.Wait()
		return nil
	}
	var wmu sync.Mutex
	send := func(typ websocket.MessageType, b []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		return c.Write(wctx, typ, b)
	}
	var outWG sync.WaitGroup
	pumpOut := func(rd io.Reader, stream byte) {
		defer outWG.Done()
		if rd == nil {
			return
		}
		buf := make([]byte, 32*1024)
		for {
			n, err := rd.Read(buf[1:])
			if n > 0 {
				buf[0] = stream
				if send(websocket.MessageBinary, buf[:n+1]) != nil {
					kill()
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	outWG.Add(2)
	go pumpOut(proc.Stdout(), StreamStdout)
	go pumpOut(proc.Stderr(), StreamStderr)
	// Input: stdin, resize and eof; a client that goes away ends the exec.
	go func() {
		stdin := proc.Stdin()
		for {
			typ, data, err := c.Read(ctx)
			if err != nil {
				if ctx.Err() == nil || !errors.Is(err, context.Canceled) {
					kill()
				}
				return
			}
			if typ == websocket.MessageBinary {
				if stdin != nil {
					_, _ = stdin.Write(data)
				}
				continue
			}
			var m OCIExecMessage
			if json.Unmarshal(data, &m) != nil {
				continue
			}
			switch m.Type {
			case "resize":
				_ = proc.Resize(m.Cols, m.Rows)
			case "eof":
				if stdin != nil {
					if req.TTY {
						_, _ = stdin.Write([]byte{4})
					} else {
						stdin.Close()
					}
				}
			}
		}
	}()
	code, werr := proc.Wait()
	outWG.Wait()
	if werr != nil {
		return fail(werr.Error())
	}
	msg, _ := json.Marshal(OCIExecMessage{Type: "exit", ExitCode: code})
	if send(websocket.MessageText, msg) == nil {
		c.Close(websocket.StatusNormalClosure, "exited")
	}
	return nil
}
