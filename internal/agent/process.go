package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/creack/pty"

	pb "github.com/nookhq/nook/internal/envdpb/process"
	"github.com/nookhq/nook/internal/envmodel"
)

const (
	readChunk = 32 * 1024
	subBuffer = 64
	// drainIdle bounds how long output readers keep reading once the process
	// exited and its pipes stay open (held by background children).
	drainIdle = 100 * time.Millisecond
)

// ---- process table ----

type processTable struct {
	mu    sync.Mutex
	procs map[uint32]*proc
}

func newProcessTable() *processTable { return &processTable{procs: map[uint32]*proc{}} }

func (t *processTable) add(p *proc) {
	t.mu.Lock()
	t.procs[p.pid] = p
	t.mu.Unlock()
}

func (t *processTable) remove(p *proc) {
	t.mu.Lock()
	if t.procs[p.pid] == p {
		delete(t.procs, p.pid)
	}
	t.mu.Unlock()
}

func (t *processTable) get(sel *pb.ProcessSelector) (*proc, error) {
	if sel == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process selector is required"))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch s := sel.Selector.(type) {
	case *pb.ProcessSelector_Pid:
		if p, ok := t.procs[s.Pid]; ok {
			return p, nil
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", s.Pid))
	case *pb.ProcessSelector_Tag:
		for _, p := range t.procs {
			if p.tag != nil && *p.tag == s.Tag {
				return p, nil
			}
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %q not found", s.Tag))
	}
	return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process selector is empty"))
}

func (t *processTable) list() []*proc {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*proc, 0, len(t.procs))
	for _, p := range t.procs {
		out = append(out, p)
	}
	return out
}

// ---- a running process ----

type subscriber struct {
	ch   chan *pb.ProcessEvent
	done chan struct{}
	once sync.Once
}

func (s *subscriber) close() { s.once.Do(func() { close(s.done) }) }

type proc struct {
	pid uint32
	tag *string
	cfg *pb.ProcessConfig

	ptyMaster *os.File // PTY processes
	stdinMu   sync.Mutex
	stdin     *os.File // pipe processes with stdin enabled; nil once closed

	mu     sync.Mutex
	subs   map[*subscriber]struct{}
	ended  *pb.ProcessEvent
	exited bool // the leader has been reaped: never signal its pid again
	done   chan struct{}
}

func (p *proc) subscribe() (*subscriber, *pb.ProcessEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended != nil {
		return nil, p.ended
	}
	s := &subscriber{ch: make(chan *pb.ProcessEvent, subBuffer), done: make(chan struct{})}
	p.subs[s] = struct{}{}
	return s, nil
}

func (p *proc) unsubscribe(s *subscriber) {
	if s == nil {
		return
	}
	s.close()
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
}

// broadcast hands ev to every subscriber, blocking until each took it or
// went away: output is never dropped for a live subscriber.
func (p *proc) broadcast(ev *pb.ProcessEvent, final bool) {
	p.mu.Lock()
	if final {
		p.ended = ev
	}
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.ch <- ev:
		case <-s.done:
		}
	}
}

// signal sends sig to the process group, unless the leader is gone.
func (p *proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited {
		return nil
	}
	if err := syscall.Kill(-int(p.pid), sig); err != nil {
		return syscall.Kill(int(p.pid), sig)
	}
	return nil
}

func (p *proc) writeInput(in *pb.ProcessInput) error {
	if in == nil {
		return nil
	}
	switch v := in.Input.(type) {
	case *pb.ProcessInput_Pty:
		if p.ptyMaster == nil {
			return connect.NewError(connect.CodeFailedPrecondition, errors.New("process has no pty"))
		}
		_, err := p.ptyMaster.Write(v.Pty)
		return wrapIOErr(err)
	case *pb.ProcessInput_Stdin:
		if p.ptyMaster != nil {
			_, err := p.ptyMaster.Write(v.Stdin)
			return wrapIOErr(err)
		}
		p.stdinMu.Lock()
		defer p.stdinMu.Unlock()
		if p.stdin == nil {
			return connect.NewError(connect.CodeFailedPrecondition, errors.New("stdin is not enabled or was closed"))
		}
		_, err := p.stdin.Write(v.Stdin)
		return wrapIOErr(err)
	}
	return nil
}

func wrapIOErr(err error) error {
	if err == nil {
		return nil
	}
	return connect.NewError(connect.CodeInternal, err)
}

// ---- starting ----

type startOpts struct {
	argv0  string
	argv   []string
	env    []string
	dir    string
	user   *User // nil: keep the agent's credentials
	pty    *pb.PTY
	stdin  bool
	tag    *string
	cfg    *pb.ProcessConfig
	stdout *os.File // when set (main process), output goes here, no events
	stderr *os.File
}

// lookPath resolves cmd against the PATH in env.
func lookPath(cmd string, env []string) (string, error) {
	if strings.Contains(cmd, "/") {
		return cmd, nil
	}
	for _, dir := range filepath.SplitList(envLookup(env, "PATH")) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, cmd)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("executable file %q not found in $PATH", cmd)
}

func credential(u *User) *syscall.Credential {
	if u == nil || os.Getuid() != 0 {
		return nil
	}
	return &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
}

// spawn starts a process and the goroutines that pump its output and wait
// for it. Subscribers registered with first are attached before any output.
func (s *Server) spawn(o startOpts, first *subscriber) (*proc, error) {
	p := &proc{tag: o.tag, cfg: o.cfg, subs: map[*subscriber]struct{}{}, done: make(chan struct{})}
	if first != nil {
		p.subs[first] = struct{}{}
	}
	attr := &syscall.ProcAttr{Dir: o.dir, Env: o.env, Sys: &syscall.SysProcAttr{Credential: credential(o.user)}}
	var childFiles []*os.File // closed in the parent after the fork
	var readers []*os.File
	var kinds []string
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	if o.pty != nil {
		master, tty, err := pty.Open()
		if err != nil {
			return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("open pty: %w", err))
		}
		if sz := o.pty.GetSize(); sz != nil && sz.Cols > 0 && sz.Rows > 0 {
			_ = pty.Setsize(master, &pty.Winsize{Cols: uint16(sz.Cols), Rows: uint16(sz.Rows)})
		}
		if o.user != nil && os.Getuid() == 0 {
			_ = tty.Chown(int(o.user.UID), int(o.user.GID))
		}
		p.ptyMaster = master
		childFiles = []*os.File{tty}
		attr.Files = []uintptr{tty.Fd(), tty.Fd(), tty.Fd()}
		attr.Sys.Setsid = true
		attr.Sys.Setctty = true
		attr.Sys.Ctty = 0
		readers = []*os.File{master}
		kinds = []string{"pty"}
	} else {
		var in *os.File
		if o.stdin {
			r, w, err := os.Pipe()
			if err != nil {
				return nil, connect.NewError(connect.CodeInternal, err)
			}
			in = r
			p.stdin = w
		} else {
			f, err := os.Open(os.DevNull)
			if err != nil {
				return nil, connect.NewError(connect.CodeInternal, err)
			}
			in = f
		}
		childFiles = append(childFiles, in)
		var outW, errW *os.File
		if o.stdout != nil {
			outW, errW = o.stdout, o.stderr
		} else {
			or, ow, err := os.Pipe()
			if err != nil {
				closeAll(childFiles)
				return nil, connect.NewError(connect.CodeInternal, err)
			}
			er, ew, err := os.Pipe()
			if err != nil {
				closeAll(childFiles)
				or.Close()
				ow.Close()
				return nil, connect.NewError(connect.CodeInternal, err)
			}
			outW, errW = ow, ew
			childFiles = append(childFiles, ow, ew)
			readers = []*os.File{or, er}
			kinds = []string{"stdout", "stderr"}
		}
		attr.Files = []uintptr{in.Fd(), outW.Fd(), errW.Fd()}
		attr.Sys.Setpgid = true
	}
	pid, wait, err := s.reaper.Spawn(o.argv0, o.argv, attr)
	closeAll(childFiles)
	if err != nil {
		closeAll(readers)
		if p.stdin != nil {
			p.stdin.Close()
		}
		return nil, err
	}
	p.pid = uint32(pid)

	var rwg sync.WaitGroup
	exitedCh := make(chan struct{})
	for i, r := range readers {
		rwg.Add(1)
		go func(r *os.File, kind string) {
			defer rwg.Done()
			p.pump(r, kind, exitedCh)
		}(r, kinds[i])
	}
	go func() {
		ws := <-wait
		p.mu.Lock()
		p.exited = true
		p.mu.Unlock()
		close(exitedCh)
		for _, r := range readers {
			_ = r.SetReadDeadline(time.Now().Add(drainIdle))
		}
		rwg.Wait()
		closeAll(readers)
		p.stdinMu.Lock()
		if p.stdin != nil {
			p.stdin.Close()
			p.stdin = nil
		}
		p.stdinMu.Unlock()
		end := &pb.ProcessEvent_EndEvent{ExitCode: int32(exitCode(ws)), Exited: ws.Exited(), Status: statusString(ws)}
		s.procs.remove(p)
		p.broadcast(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: end}}, true)
		close(p.done)
		slog.Debug("process ended", "pid", pid, "status", end.Status)
	}()
	return p, nil
}

// pump reads one output stream and broadcasts it as data events. After the
// process exited it keeps reading only while data keeps arriving.
func (p *proc) pump(r *os.File, kind string, exited <-chan struct{}) {
	buf := make([]byte, readChunk)
	for {
		afterExit := false
		select {
		case <-exited:
			afterExit = true
			_ = r.SetReadDeadline(time.Now().Add(drainIdle))
		default:
		}
		n, err := r.Read(buf)
		if n > 0 {
			data := make([]byte, n)
			copy(data, buf[:n])
			var d *pb.ProcessEvent_DataEvent
			switch kind {
			case "pty":
				d = &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Pty{Pty: data}}
			case "stdout":
				d = &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stdout{Stdout: data}}
			default:
				d = &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stderr{Stderr: data}}
			}
			p.broadcast(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: d}}, false)
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				if afterExit && n == 0 {
					return // exited and no more data arriving: pipes held by others
				}
				continue // deadline set by the waiter at exit: re-arm and drain
			}
			return // EOF, or EIO on a PTY whose slave side is closed
		}
	}
}

// ---- RPC service ----

type processService struct{ s *Server }

func keepaliveInterval(h interface{ Get(string) string }) time.Duration {
	v := h.Get("Keepalive-Ping-Interval")
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n <= 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}

func (ps *processService) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	s := ps.s
	cfg := req.Msg.GetProcess()
	if cfg == nil || cfg.Cmd == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is required"))
	}
	u, err := s.userFromRequest(req.Header(), "")
	if err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	env := s.startEnv(req.Header(), u, cfg.Envs)
	dir, err := s.resolveCwd(cfg.Cwd, u)
	if err != nil {
		return err
	}
	argv0, err := lookPath(cfg.Cmd, env)
	if err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	stdin := req.Msg.Stdin == nil || *req.Msg.Stdin
	sub := &subscriber{ch: make(chan *pb.ProcessEvent, subBuffer), done: make(chan struct{})}
	p, err := s.spawn(startOpts{
		argv0: argv0, argv: append([]string{cfg.Cmd}, cfg.Args...), env: env, dir: dir, user: u,
		pty: req.Msg.Pty, stdin: stdin, tag: req.Msg.Tag, cfg: cfg,
	}, sub)
	if err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) {
			return err
		}
		return connect.NewError(connect.CodeInternal, fmt.Errorf("start %s: %w", cfg.Cmd, err))
	}
	s.procs.add(p)
	defer p.unsubscribe(sub)
	// The process lives until the request's Connect-Timeout-Ms deadline, as
	// envd's do; a client that merely disconnects (the SDK's disconnect())
	// leaves it running, to be reattached with Connect.
	if dl, ok := ctx.Deadline(); ok {
		kill := time.AfterFunc(time.Until(dl), func() { _ = p.signal(syscall.SIGKILL) })
		go func() {
			<-p.done
			kill.Stop()
		}()
	}
	if err := stream.Send(&pb.StartResponse{Event: &pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: p.pid}}}}); err != nil {
		return err
	}
	return pumpEvents(ctx, sub, keepaliveInterval(req.Header()), func(ev *pb.ProcessEvent) error {
		return stream.Send(&pb.StartResponse{Event: ev})
	})
}

func pumpEvents(ctx context.Context, sub *subscriber, ka time.Duration, send func(*pb.ProcessEvent) error) error {
	var tick <-chan time.Time
	if ka > 0 {
		t := time.NewTicker(ka)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case ev := <-sub.ch:
			if err := send(ev); err != nil {
				return err
			}
			if _, ok := ev.Event.(*pb.ProcessEvent_End); ok {
				return nil
			}
		case <-tick:
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (s *Server) resolveCwd(cwd *string, u *User) (string, error) {
	if cwd != nil && *cwd != "" {
		dir := s.resolvePath(*cwd, u)
		fi, err := os.Stat(dir)
		if err != nil {
			return "", connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("cwd '%s' does not exist", dir))
		}
		if !fi.IsDir() {
			return "", connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("cwd '%s' is not a directory", dir))
		}
		return dir, nil
	}
	for _, d := range []string{s.workdir(), u.Home} {
		if d == "" {
			continue
		}
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			return d, nil
		}
	}
	return "/", nil
}

func (ps *processService) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	p, err := ps.s.procs.get(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	sub, ended := p.subscribe()
	send := func(ev *pb.ProcessEvent) error { return stream.Send(&pb.ConnectResponse{Event: ev}) }
	if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: p.pid}}}); err != nil {
		p.unsubscribe(sub)
		return err
	}
	if ended != nil {
		return send(ended)
	}
	defer p.unsubscribe(sub)
	return pumpEvents(ctx, sub, keepaliveInterval(req.Header()), send)
}

func (ps *processService) List(ctx context.Context, req *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	out := &pb.ListResponse{}
	for _, p := range ps.s.procs.list() {
		out.Processes = append(out.Processes, &pb.ProcessInfo{Config: p.cfg, Pid: p.pid, Tag: p.tag})
	}
	return connect.NewResponse(out), nil
}

func (ps *processService) Update(ctx context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	p, err := ps.s.procs.get(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if sz := req.Msg.GetPty().GetSize(); sz != nil {
		if p.ptyMaster == nil {
			return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("process has no pty"))
		}
		if err := pty.Setsize(p.ptyMaster, &pty.Winsize{Cols: uint16(sz.Cols), Rows: uint16(sz.Rows)}); err != nil {
			return nil, connect.NewError(connect.CodeInternal, err)
		}
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}

func (ps *processService) SendInput(ctx context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	p, err := ps.s.procs.get(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.writeInput(req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

func (ps *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		msg := stream.Msg()
		switch ev := msg.Event.(type) {
		case *pb.StreamInputRequest_Start:
			var err error
			if p, err = ps.s.procs.get(ev.Start.GetProcess()); err != nil {
				return nil, err
			}
		case *pb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("start event with a process selector must come first"))
			}
			if err := p.writeInput(ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

func (ps *processService) SendSignal(ctx context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	p, err := ps.s.procs.get(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	var sig syscall.Signal
	switch req.Msg.Signal {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case pb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("unsupported signal %v", req.Msg.Signal))
	}
	if err := p.signal(sig); err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

func (ps *processService) CloseStdin(ctx context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	p, err := ps.s.procs.get(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if p.ptyMaster != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("cannot close stdin of a pty process; send Ctrl+D (0x04) instead"))
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}

// ---- main process ----

// StartMain starts the sandbox's main process with the agent's environment,
// output going to the agent's stdout/stderr. It returns the pid and a channel
// closed when it exits.
func (s *Server) StartMain(args []string, cwd, user string) (int, <-chan struct{}, error) {
	var u *User
	if user != "" {
		var err error
		if u, err = s.users.Lookup(user); err != nil {
			return 0, nil, err
		}
	}
	env := envmodel.Main(envmodel.Parse(s.cfg.AgentEnv)).List()
	argv0, err := lookPath(args[0], env)
	if err != nil {
		return 0, nil, err
	}
	if cwd == "" {
		cwd = "/"
	}
	sub := &subscriber{ch: make(chan *pb.ProcessEvent, subBuffer), done: make(chan struct{})}
	p, err := s.spawn(startOpts{argv0: argv0, argv: args, env: env, dir: cwd, user: u, stdout: os.Stdout, stderr: os.Stderr}, sub)
	if err != nil {
		return 0, nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range sub.ch {
			if e, ok := ev.Event.(*pb.ProcessEvent_End); ok {
				slog.Info("start command exited", "pid", p.pid, "status", e.End.Status)
				p.unsubscribe(sub)
				return
			}
		}
	}()
	return int(p.pid), done, nil
}
