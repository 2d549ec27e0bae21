package native

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/coder/websocket"

	pb "github.com/nookhq/nook/internal/envdpb/process"
	"github.com/nookhq/nook/internal/envmodel"
	"github.com/nookhq/nook/internal/errdefs"
)

// Terminal defaults and bounds.
const (
	DefaultCols       = 80
	DefaultRows       = 24
	DefaultBufferSize = 256 << 10
	MaxBufferSize     = 16 << 20
)

// TerminalOptions are createTerminal()'s options.
type TerminalOptions struct {
	Command    []string
	Cwd        string
	Env        envmodel.Launch
	Cols, Rows int
	BufferSize int
}

// CreateTerminal starts an interactive program (default: bash, else sh) on
// a pseudo-terminal with the image env, TERM=xterm-256color and the launch
// env; stored setEnvVars names are not merged.
func (s *Service) CreateTerminal(id string, o TerminalOptions) (Info, error) {
	if err := envmodel.ValidateLaunch(o.Env); err != nil {
		return Info{}, fmt.Errorf("%v: %w", err, errdefs.ErrInvalid)
	}
	if o.Cols == 0 {
		o.Cols = DefaultCols
	}
	if o.Rows == 0 {
		o.Rows = DefaultRows
	}
	if o.Cols < 1 || o.Rows < 1 || o.Cols > 65535 || o.Rows > 65535 {
		return Info{}, fmt.Errorf("cols and rows must be 1..65535: %w", errdefs.ErrInvalid)
	}
	if o.BufferSize == 0 {
		o.BufferSize = DefaultBufferSize
	}
	if o.BufferSize < 1024 || o.BufferSize > MaxBufferSize {
		return Info{}, fmt.Errorf("bufferSize must be 1024..%d bytes: %w", MaxBufferSize, errdefs.ErrInvalid)
	}
	if len(o.Command) > 0 && o.Command[0] == "" {
		return Info{}, fmt.Errorf("command must be a non-empty argv: %w", errdefs.ErrInvalid)
	}
	b, err := s.box(id)
	if err != nil {
		return Info{}, err
	}
	rec, err := s.Sandboxes.Get(id)
	if err != nil {
		return Info{}, err
	}
	image, user, workdir := s.imageEnv(rec)
	env := envmodel.Terminal(image, o.Env)
	cwd := o.Cwd
	if cwd == "" {
		cwd = workdir
	}
	lo := launchOpts{kind: kindTerminal, cwd: cwd, env: env, user: user, logBytes: o.BufferSize,
		pty: &pb.PTY{Size: &pb.PTY_Size{Cols: uint32(o.Cols), Rows: uint32(o.Rows)}}}
	if len(o.Command) > 0 {
		lo.argv = o.Command
		p, err := s.launch(b, rec, lo)
		if err != nil {
			return Info{}, err
		}
		return p.info(), nil
	}
	lo.argv = []string{"/bin/bash"}
	p, err := s.launch(b, rec, lo)
	if errors.Is(err, errdefs.ErrInvalid) {
		lo.argv = []string{"/bin/sh"}
		p, err = s.launch(b, rec, lo)
	}
	if err != nil {
		return Info{}, err
	}
	return p.info(), nil
}

// Write sends input to a terminal.
func (s *Service) Write(ctx context.Context, id, tid string, data []byte) error {
	p, err := s.get(id, kindTerminal, tid)
	if err != nil {
		return err
	}
	return p.write(ctx, data)
}

func (p *proc) write(ctx context.Context, data []byte) error {
	if !p.running() {
		return fmt.Errorf("terminal %s has exited: %w", p.id, errdefs.ErrConflict)
	}
	if len(data) == 0 {
		return nil
	}
	_, err := p.rt.pc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{
		Process: p.rt.selector(p.pid), Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: data}},
	}))
	if err != nil {
		if !p.running() {
			return fmt.Errorf("terminal %s has exited: %w", p.id, errdefs.ErrConflict)
		}
		return connectErr("write", err)
	}
	return nil
}

// Resize sets a terminal's window size.
func (s *Service) Resize(ctx context.Context, id, tid string, cols, rows int) error {
	p, err := s.get(id, kindTerminal, tid)
	if err != nil {
		return err
	}
	return p.resize(ctx, cols, rows)
}

func (p *proc) resize(ctx context.Context, cols, rows int) error {
	if cols < 1 || rows < 1 || cols > 65535 || rows > 65535 {
		return fmt.Errorf("cols and rows must be 1..65535: %w", errdefs.ErrInvalid)
	}
	if !p.running() {
		return fmt.Errorf("terminal %s has exited: %w", p.id, errdefs.ErrConflict)
	}
	_, err := p.rt.pc.Update(ctx, connect.NewRequest(&pb.UpdateRequest{
		Process: p.rt.selector(p.pid), Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: uint32(cols), Rows: uint32(rows)}},
	}))
	if err != nil {
		if !p.running() {
			return fmt.Errorf("terminal %s has exited: %w", p.id, errdefs.ErrConflict)
		}
		return connectErr("resize", err)
	}
	p.mu.Lock()
	p.cols, p.rows = uint16(cols), uint16(rows)
	p.mu.Unlock()
	return nil
}

// Interrupt types Ctrl-C into a terminal (SIGINT to its foreground job).
func (s *Service) Interrupt(ctx context.Context, id, tid string) error {
	return s.Write(ctx, id, tid, []byte{3})
}

// Terminate hangs up a terminal's process group, then kills it after
// KillGrace.
func (s *Service) Terminate(ctx context.Context, id, tid string) error {
	p, err := s.get(id, kindTerminal, tid)
	if err != nil {
		return err
	}
	if !p.running() {
		return fmt.Errorf("terminal %s has already exited: %w", tid, errdefs.ErrConflict)
	}
	p.stop(syscall.SIGHUP)
	return nil
}

// ---- WebSocket attach ----

// ControlMessage is a text frame of the terminal WebSocket: from the client
// "resize" (cols, rows) or "input" (data); from nook "exit" (the status).
type ControlMessage struct {
	Type   string  `json:"type"`
	Cols   int     `json:"cols,omitempty"`
	Rows   int     `json:"rows,omitempty"`
	Data   string  `json:"data,omitempty"`
	Status *Status `json:"status,omitempty"`
	Cursor uint64  `json:"cursor,omitempty"`
}

// Attach serves a WebSocket on a terminal: first the buffered output
// (replay, the default, or since=CURSOR, or replay=false for only new
// output), then live output as binary frames; binary frames from the client
// are input and text frames are ControlMessages. When the terminal ends,
// nook sends {"type":"exit","status":...} and closes normally.
func (s *Service) Attach(w http.ResponseWriter, r *http.Request, id, tid string) error {
	p, err := s.get(id, kindTerminal, tid)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	o := LogsOptions{Replay: q.Get("replay") != "false", Follow: true}
	if v := q.Get("since"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return fmt.Errorf("since %q: want a cursor: %w", v, errdefs.ErrInvalid)
		}
		o.Since = &n
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		return nil // Accept answered the request
	}
	defer c.CloseNow()
	c.SetReadLimit(1 << 20)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	go func() {
		defer cancel()
		for {
			typ, data, err := c.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageBinary {
				if err := p.write(ctx, data); err != nil && !errors.Is(err, errdefs.ErrConflict) {
					s.Log.Debug("terminal input", "err", err)
				}
				continue
			}
			var m ControlMessage
			if json.Unmarshal(data, &m) != nil {
				continue
			}
			switch m.Type {
			case "resize":
				_ = p.resize(ctx, m.Cols, m.Rows)
			case "input":
				_ = p.write(ctx, []byte(m.Data))
			}
		}
	}()
	err = s.Logs(ctx, id, kindTerminal, tid, o, func(ch LogChunk) error {
		for _, e := range ch.Events {
			wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
			err := c.Write(wctx, websocket.MessageBinary, e.Data)
			wcancel()
			if err != nil {
				return err
			}
		}
		if ch.End != nil {
			msg, _ := json.Marshal(ControlMessage{Type: "exit", Status: ch.End, Cursor: ch.Cursor})
			if err := c.Write(ctx, websocket.MessageText, msg); err != nil {
				return err
			}
			return c.Close(websocket.StatusNormalClosure, "terminal exited")
		}
		return nil
	})
	if err == nil && ctx.Err() == nil {
		return nil
	}
	c.Close(websocket.StatusGoingAway, "detached")
	return nil
}
