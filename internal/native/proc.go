package native

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/nookhq/nook/internal/agentclient"
	"github.com/nookhq/nook/internal/agentwire"
	pb "github.com/nookhq/nook/internal/envdpb/process"
	"github.com/nookhq/nook/internal/envdpb/process/processconnect"
	"github.com/nookhq/nook/internal/envmodel"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/sandbox"
)

const (
	kindProcess  = "process"
	kindTerminal = "terminal"

	// KillGrace is how long a timed-out or terminated process has between
	// SIGTERM (SIGHUP for terminals) and SIGKILL.
	KillGrace = time.Second
)

// Process states.
const (
	StateRunning = "running"
	StateExited  = "exited"
	StateError   = "error"
)

// Status is a process's (or terminal's) state.
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

// Info describes a process or terminal.
type Info struct {
	ID      string   `json:"id"`
	Pid     uint32   `json:"pid"`
	Command []string `json:"command"`
	Cwd     string   `json:"cwd,omitempty"`
	Status
	Cursor uint64 `json:"cursor"`
	Cols   uint16 `json:"cols,omitempty"`
	Rows   uint16 `json:"rows,omitempty"`
}

// proc is a process or terminal launched through the sandbox's agent.
type proc struct {
	id      string
	kind    string
	pid     uint32
	argv    []string
	cwd     string
	started time.Time
	log     *outputLog
	box     *box
	rt      *agentRPC
	done    chan struct{}
	cancel  context.CancelFunc

	mu         sync.Mutex
	status     Status
	timedOut   bool
	cols, rows uint16
}

func (p *proc) info() Info {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.status
	st.TimedOut = p.timedOut
	return Info{ID: p.id, Pid: p.pid, Command: p.argv, Cwd: p.cwd, Status: st, Cursor: p.log.cursor(), Cols: p.cols, Rows: p.rows}
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// ---- talking to the agent ----

// agentRPC calls one sandbox's agent as nook serve: with its access token,
// as the native user, asking for the exact environment.
type agentRPC struct {
	agent *agentclient.Client
	token string
	user  string
	pc    processconnect.ProcessClient
	hc    *http.Client
}

type headerRT struct {
	base http.RoundTripper
	h    http.Header
}

func (t headerRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range t.h {
		r.Header[k] = v
	}
	return t.base.RoundTrip(r)
}

func newAgentRPC(agent *agentclient.Client, rec sandbox.Sandbox, user string) *agentRPC {
	h := http.Header{}
	h.Set("X-Access-Token", rec.AccessToken)
	h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	h.Set(agentwire.LaunchEnvHeader, agentwire.LaunchEnvExact)
	hc := &http.Client{Transport: headerRT{base: agent.HTTP.Transport, h: h}}
	return &agentRPC{agent: agent, token: rec.AccessToken, user: user, hc: hc,
		pc: processconnect.NewProcessClient(hc, "http://sandbox")}
}

func (a *agentRPC) selector(pid uint32) *pb.ProcessSelector {
	return &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
}

// signal sends sig to the process group of pid; errdefs.ErrConflict when
// the process has already exited.
func (a *agentRPC) signal(ctx context.Context, pid uint32, sig syscall.Signal) error {
	body, _ := json.Marshal(map[string]any{"pid": pid, "signal": int(sig)})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://sandbox"+agentwire.ControlPrefix+"signal", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.hc.Do(req)
	if err != nil {
		return fmt.Errorf("signal: %w", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	switch {
	case resp.StatusCode < 300:
		return nil
	case resp.StatusCode == http.StatusConflict, resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("process has already exited: %w", errdefs.ErrConflict)
	}
	return fmt.Errorf("signal: %s: %s", resp.Status, bytes.TrimSpace(msg))
}

// connectErr maps an agent error to nook's error kinds.
func connectErr(what string, err error) error {
	switch connect.CodeOf(err) {
	case connect.CodeInvalidArgument, connect.CodeFailedPrecondition:
		return fmt.Errorf("%s: %s: %w", what, connectMessage(err), errdefs.ErrInvalid)
	case connect.CodeNotFound:
		return fmt.Errorf("%s: %s: %w", what, connectMessage(err), errdefs.ErrConflict)
	case connect.CodeInternal:
		// The agent could not execute the command: the caller's mistake.
		if m := connectMessage(err); strings.Contains(m, "no such file or directory") || strings.Contains(m, "permission denied") ||
			strings.Contains(m, "exec format error") || strings.Contains(m, "not a directory") {
			return fmt.Errorf("%s: %s: %w", what, m, errdefs.ErrInvalid)
		}
	case connect.CodeUnavailable:
		return fmt.Errorf("%s: %s: %w", what, connectMessage(err), errdefs.ErrUnavailable)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func connectMessage(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}

// ---- launching ----

type launchOpts struct {
	kind     string
	argv     []string
	cwd      string
	env      envmodel.Env
	pty      *pb.PTY
	timeout  time.Duration
	logBytes int
	user     string
}

// launch starts a process through the agent and answers once it has
// launched (the agent's start event).
func (s *Service) launch(b *box, rec sandbox.Sandbox, o launchOpts) (*proc, error) {
	agent, _, err := s.Sandboxes.Agent(rec.ID)
	if err != nil {
		return nil, err
	}
	rt := newAgentRPC(agent, rec, o.user)
	cfg := &pb.ProcessConfig{Cmd: o.argv[0], Args: o.argv[1:], Envs: o.env}
	if o.cwd != "" {
		cfg.Cwd = &o.cwd
	}
	stdin := o.pty != nil
	ctx, cancel := context.WithCancel(b.ctx)
	stream, err := rt.pc.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: cfg, Pty: o.pty, Stdin: &stdin}))
	if err != nil {
		cancel()
		return nil, connectErr("launch "+o.argv[0], err)
	}
	var pid uint32
	for pid == 0 {
		if !stream.Receive() {
			err := stream.Err()
			stream.Close()
			cancel()
			if err == nil {
				err = errors.New("the agent ended the stream before the process started")
			}
			return nil, connectErr("launch "+o.argv[0], err)
		}
		if st := stream.Msg().GetEvent().GetStart(); st != nil {
			pid = st.Pid
		}
	}
	now := time.Now().UTC()
	p := &proc{
		id: newID(map[string]string{kindProcess: "p_", kindTerminal: "t_"}[o.kind]), kind: o.kind, pid: pid,
		argv: o.argv, cwd: o.cwd, started: now, log: newOutputLog(o.logBytes), box: b, rt: rt,
		done: make(chan struct{}), cancel: cancel,
		status: Status{State: StateRunning, StartedAt: now},
	}
	if sz := o.pty.GetSize(); sz != nil {
		p.cols, p.rows = uint16(sz.Cols), uint16(sz.Rows)
	}
	b.add(p)
	go s.pump(p, stream)
	if o.timeout > 0 {
		t := time.AfterFunc(o.timeout, func() {
			p.mu.Lock()
			p.timedOut = true
			p.mu.Unlock()
			s.Log.Debug("process timed out", "sandbox", rec.ID, "process", p.id)
			p.stop(syscall.SIGTERM)
		})
		go func() { <-p.done; t.Stop() }()
	}
	return p, nil
}

// stop sends first to the process group, then SIGKILL after KillGrace if
// it is still running.
func (p *proc) stop(first syscall.Signal) {
	ctx, cancel := context.WithTimeout(p.box.ctx, 5*time.Second)
	defer cancel()
	if err := p.rt.signal(ctx, p.pid, first); err != nil {
		return
	}
	go func() {
		select {
		case <-p.done:
		case <-time.After(KillGrace):
			ctx, cancel := context.WithTimeout(p.box.ctx, 5*time.Second)
			defer cancel()
			_ = p.rt.signal(ctx, p.pid, syscall.SIGKILL)
		}
	}()
}

// pump records a process's events until it ends.
func (s *Service) pump(p *proc, stream *connect.ServerStreamForClient[pb.StartResponse]) {
	defer stream.Close()
	defer p.cancel()
	var end *pb.ProcessEvent_EndEvent
	for end == nil && stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			switch o := d.Output.(type) {
			case *pb.ProcessEvent_DataEvent_Stdout:
				p.log.append("stdout", o.Stdout)
			case *pb.ProcessEvent_DataEvent_Stderr:
				p.log.append("stderr", o.Stderr)
			case *pb.ProcessEvent_DataEvent_Pty:
				p.log.append("pty", o.Pty)
			}
		}
		if e := ev.GetEnd(); e != nil {
			end = e
		}
	}
	now := time.Now().UTC()
	p.mu.Lock()
	p.status.EndedAt = &now
	switch {
	case end != nil && end.Exited:
		code := int(end.ExitCode)
		p.status.State, p.status.ExitCode = StateExited, &code
	case end != nil:
		p.status.State = StateExited
		if sig, name, ok := parseSignal(end.Status); ok {
			p.status.Signal, p.status.SignalName = &sig, name
		} else {
			p.status.Error = end.Status
		}
	default:
		p.status.State = StateError
		msg := "lost contact with the sandbox"
		if err := stream.Err(); err != nil && p.box.ctx.Err() == nil {
			msg += ": " + err.Error()
		} else if p.box.ctx.Err() != nil {
			msg = "the sandbox ended"
		}
		p.status.Error = msg
	}
	p.mu.Unlock()
	p.log.end()
	close(p.done)
	p.box.finish(p)
}

// parseSignal reads the agent's "signal: terminated" status.
func parseSignal(status string) (int, string, bool) {
	name, ok := strings.CutPrefix(status, "signal: ")
	if !ok {
		return 0, "", false
	}
	name = strings.TrimSuffix(name, " (core dumped)")
	for i := 1; i < 65; i++ {
		if syscall.Signal(i).String() == name {
			return i, signalName(i), true
		}
	}
	return 0, "", false
}

var signalNames = map[int]string{1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 5: "SIGTRAP", 6: "SIGABRT", 7: "SIGBUS",
	8: "SIGFPE", 9: "SIGKILL", 10: "SIGUSR1", 11: "SIGSEGV", 12: "SIGUSR2", 13: "SIGPIPE", 14: "SIGALRM", 15: "SIGTERM"}

func signalName(n int) string {
	if s, ok := signalNames[n]; ok {
		return s
	}
	return fmt.Sprintf("SIG%d", n)
}

// ---- exec ----

// ExecOptions are exec()'s options.
type ExecOptions struct {
	Cwd     string
	Env     envmodel.Launch
	Timeout time.Duration
}

// Exec starts argv in sandbox id with the image env, then the stored
// names, then the launch env, and answers once it has launched.
func (s *Service) Exec(id string, argv []string, o ExecOptions) (Info, error) {
	if len(argv) == 0 || argv[0] == "" {
		return Info{}, fmt.Errorf("command must be a non-empty argv: %w", errdefs.ErrInvalid)
	}
	if o.Timeout < 0 {
		return Info{}, fmt.Errorf("timeout must not be negative: %w", errdefs.ErrInvalid)
	}
	if err := envmodel.ValidateLaunch(o.Env); err != nil {
		return Info{}, fmt.Errorf("%v: %w", err, errdefs.ErrInvalid)
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
	b.mu.Lock()
	env := envmodel.Exec(image, b.stored, o.Env)
	b.mu.Unlock()
	cwd := o.Cwd
	if cwd == "" {
		cwd = workdir
	}
	p, err := s.launch(b, rec, launchOpts{kind: kindProcess, argv: argv, cwd: cwd, env: env, timeout: o.Timeout, user: user})
	if err != nil {
		return Info{}, err
	}
	return p.info(), nil
}

// Kill sends sig to a running process's group; ErrConflict once it exited.
func (s *Service) Kill(ctx context.Context, id, pid string, sig int) error {
	if sig == 0 {
		sig = int(syscall.SIGTERM)
	}
	if sig < 1 || sig > 64 {
		return fmt.Errorf("signal %d: want 1..64: %w", sig, errdefs.ErrInvalid)
	}
	p, err := s.get(id, kindProcess, pid)
	if err != nil {
		return err
	}
	return p.kill(ctx, sig)
}

func (p *proc) kill(ctx context.Context, sig int) error {
	if !p.running() {
		return fmt.Errorf("%s %s has already exited: %w", p.kind, p.id, errdefs.ErrConflict)
	}
	if err := p.rt.signal(ctx, p.pid, syscall.Signal(sig)); err != nil {
		if errors.Is(err, errdefs.ErrConflict) {
			return fmt.Errorf("%s %s has already exited: %w", p.kind, p.id, errdefs.ErrConflict)
		}
		return err
	}
	return nil
}

// ---- waiting and reading ----

// Wait waits up to timeout (0: no limit) for a process or terminal to end.
func (s *Service) Wait(ctx context.Context, id, kind, pid string, timeout time.Duration) (Info, error) {
	p, err := s.get(id, kind, pid)
	if err != nil {
		return Info{}, err
	}
	var tc <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		tc = t.C
	}
	select {
	case <-p.done:
		return p.info(), nil
	case <-tc:
		return p.info(), fmt.Errorf("%s %s still running after %s: %w", kind, pid, timeout, ErrTimeout)
	case <-ctx.Done():
		return Info{}, ctx.Err()
	}
}

// LogsOptions select events: since a cursor, or from the oldest retained
// (replay, the default when since is absent) or only new ones.
type LogsOptions struct {
	Since  *uint64
	Replay bool
	Follow bool
	Stream string // "", stdout or stderr
}

// LogChunk is one answer of Logs: events, the cursor to continue from,
// whether earlier events were dropped, and the final status once ended.
type LogChunk struct {
	Events []Event `json:"events"`
	Cursor uint64  `json:"cursor"`
	Gap    bool    `json:"gap,omitempty"`
	End    *Status `json:"end,omitempty"`
}

// Logs streams a process's (or terminal's) events to emit: what is
// retained after the start cursor, and with Follow everything until the
// process ends. emit gets the final chunk with End set once it ended.
func (s *Service) Logs(ctx context.Context, id, kind, pid string, o LogsOptions, emit func(LogChunk) error) error {
	p, err := s.get(id, kind, pid)
	if err != nil {
		return err
	}
	var cur uint64
	switch {
	case o.Since != nil:
		cur = *o.Since
	case !o.Replay:
		cur = p.log.cursor()
	}
	for {
		evs, gap, ended, changed := p.log.since(cur)
		chunk := LogChunk{Cursor: cur, Gap: gap}
		for _, e := range evs {
			chunk.Cursor = e.Cursor
			if o.Stream == "" || o.Stream == e.Stream {
				chunk.Events = append(chunk.Events, e)
			}
		}
		cur = chunk.Cursor
		if ended {
			<-p.done
			st := p.info().Status
			chunk.End = &st
			return emit(chunk)
		}
		if !o.Follow {
			return emit(chunk)
		}
		if len(chunk.Events) > 0 || gap {
			if err := emit(chunk); err != nil {
				return err
			}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil
		}
	}
}

// OutputOptions bound output().
type OutputOptions struct {
	MaxBytes int           // 0: everything retained
	Timeout  time.Duration // 0: wait as long as it runs
}

// Output is output()'s answer.
type Output struct {
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	ExitCode   *int   `json:"exitCode"`
	Signal     *int   `json:"signal"`
	SignalName string `json:"signalName,omitempty"`
	TimedOut   bool   `json:"timedOut"`
	Truncated  bool   `json:"truncated"`
	Status
}

// Output waits for a process to end and returns its retained output.
func (s *Service) Output(ctx context.Context, id, pid string, o OutputOptions) (Output, error) {
	if o.MaxBytes < 0 || o.Timeout < 0 {
		return Output{}, fmt.Errorf("maxBytes and timeout must not be negative: %w", errdefs.ErrInvalid)
	}
	info, err := s.Wait(ctx, id, kindProcess, pid, o.Timeout)
	if err != nil {
		return Output{}, err
	}
	p, err := s.get(id, kindProcess, pid)
	if err != nil {
		return Output{}, err
	}
	evs, _, _, _ := p.log.since(0)
	var out, errb bytes.Buffer
	total := 0
	truncated := p.log.truncated()
	for _, e := range evs {
		d := e.Data
		if o.MaxBytes > 0 && total+len(d) > o.MaxBytes {
			d = d[:o.MaxBytes-total]
			truncated = true
		}
		total += len(d)
		if e.Stream == "stderr" {
			errb.Write(d)
		} else {
			out.Write(d)
		}
		if o.MaxBytes > 0 && total >= o.MaxBytes {
			if e.Cursor != evs[len(evs)-1].Cursor || len(d) < len(e.Data) {
				truncated = true
			}
			break
		}
	}
	st := info.Status
	return Output{Stdout: out.String(), Stderr: errb.String(), ExitCode: st.ExitCode, Signal: st.Signal,
		SignalName: st.SignalName, TimedOut: st.TimedOut, Truncated: truncated, Status: st}, nil
}

// LogMatch is waitForLog's answer.
type LogMatch struct {
	Line   string   `json:"line"`
	Stream string   `json:"stream"`
	Groups []string `json:"groups"`
	Cursor uint64   `json:"cursor"`
}

// WaitForLog waits until a line of output (stream "" for both) matches
// pattern. It fails when the process ends first or timeout passes.
func (s *Service) WaitForLog(ctx context.Context, id, pid, pattern, stream string, since *uint64, timeout time.Duration) (LogMatch, error) {
	re, err := regexp.Compile(pattern)
	if err != nil {
		return LogMatch{}, fmt.Errorf("pattern: %v: %w", err, errdefs.ErrInvalid)
	}
	if stream != "" && stream != "stdout" && stream != "stderr" {
		return LogMatch{}, fmt.Errorf("stream %q: want stdout or stderr: %w", stream, errdefs.ErrInvalid)
	}
	p, err := s.get(id, kindProcess, pid)
	if err != nil {
		return LogMatch{}, err
	}
	var tc <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		tc = t.C
	}
	var cur uint64
	if since != nil {
		cur = *since
	}
	partial := map[string][]byte{}
	for {
		evs, _, ended, changed := p.log.since(cur)
		for _, e := range evs {
			cur = e.Cursor
			if stream != "" && e.Stream != stream {
				continue
			}
			data := append(partial[e.Stream], e.Data...)
			for {
				line, rest, full := bytes.Cut(data, []byte("\n"))
				if m := re.FindStringSubmatch(string(line)); m != nil {
					return LogMatch{Line: string(line), Stream: e.Stream, Groups: m, Cursor: e.Cursor}, nil
				}
				if !full {
					break
				}
				data = rest
			}
			partial[e.Stream] = append([]byte(nil), data...)
		}
		if ended {
			return LogMatch{}, fmt.Errorf("process %s ended before its output matched %q: %w", pid, pattern, errdefs.ErrConflict)
		}
		select {
		case <-changed:
		case <-tc:
			return LogMatch{}, fmt.Errorf("no output of process %s matched %q within %s: %w", pid, pattern, timeout, ErrTimeout)
		case <-ctx.Done():
			return LogMatch{}, ctx.Err()
		}
	}
}

// WaitForPort waits until something accepts TCP connections on port of the
// sandbox's loopback. It fails when the process ends first or timeout passes.
func (s *Service) WaitForPort(ctx context.Context, id, pid string, port int, timeout time.Duration) error {
	if port < 1 || port > 65535 {
		return fmt.Errorf("port %d: want 1..65535: %w", port, errdefs.ErrInvalid)
	}
	p, err := s.get(id, kindProcess, pid)
	if err != nil {
		return err
	}
	deadline := time.Time{}
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	for {
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := p.rt.agent.DialPort(dctx, port)
		cancel()
		if err == nil {
			conn.Close()
			return nil
		}
		if !p.running() {
			return fmt.Errorf("process %s ended before port %d accepted connections: %w", pid, port, errdefs.ErrConflict)
		}
		if !deadline.IsZero() && time.Now().After(deadline) {
			return fmt.Errorf("port %d did not accept connections within %s: %w", port, timeout, ErrTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.done:
		case <-time.After(100 * time.Millisecond):
		}
	}
}
