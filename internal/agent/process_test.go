package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/nookhq/nook/internal/envdpb/process"
)

type result struct {
	pid        uint32
	stdout     []byte
	stderr     []byte
	pty        []byte
	end        *pb.ProcessEvent_EndEvent
	keepalives int
}

// collect drains a Start/Connect stream.
func collect[T any, PT interface {
	*T
	GetEvent() *pb.ProcessEvent
}](t *testing.T, stream *connect.ServerStreamForClient[T]) (result, error) {
	t.Helper()
	var r result
	for stream.Receive() {
		ev := PT(stream.Msg()).GetEvent()
		switch e := ev.Event.(type) {
		case *pb.ProcessEvent_Start:
			r.pid = e.Start.Pid
		case *pb.ProcessEvent_Data:
			r.stdout = append(r.stdout, e.Data.GetStdout()...)
			r.stderr = append(r.stderr, e.Data.GetStderr()...)
			r.pty = append(r.pty, e.Data.GetPty()...)
		case *pb.ProcessEvent_End:
			r.end = e.End
		case *pb.ProcessEvent_Keepalive:
			r.keepalives++
		}
	}
	return r, stream.Err()
}

func startReq(cmd string, args ...string) *connect.Request[pb.StartRequest] {
	return connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: cmd, Args: args}})
}

func firstPid[T any, PT interface {
	*T
	GetEvent() *pb.ProcessEvent
}](t *testing.T, stream *connect.ServerStreamForClient[T]) uint32 {
	t.Helper()
	if !stream.Receive() {
		t.Fatalf("no start event: %v", stream.Err())
	}
	st := PT(stream.Msg()).GetEvent().GetStart()
	if st == nil || st.Pid == 0 {
		t.Fatalf("first event is not start: %v", stream.Msg())
	}
	return st.Pid
}

func TestStartOutputAndExit(t *testing.T) {
	ta := newTestAgent(t)
	stream, err := ta.proc.Start(ctxT(t, 10*time.Second), startReq("/bin/sh", "-c", "echo hi; echo err >&2; exit 3"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := collect(t, stream)
	if err != nil {
		t.Fatal(err)
	}
	if r.pid == 0 || string(r.stdout) != "hi\n" || string(r.stderr) != "err\n" {
		t.Fatalf("pid=%d stdout=%q stderr=%q", r.pid, r.stdout, r.stderr)
	}
	if r.end == nil || r.end.ExitCode != 3 || !r.end.Exited || r.end.Status != "exit status 3" {
		t.Fatalf("end = %v", r.end)
	}
}

func TestStartErrors(t *testing.T) {
	ta := newTestAgent(t)
	req := startReq("/bin/true")
	cwd := "/does/not/exist"
	req.Msg.Process.Cwd = &cwd
	stream, err := ta.proc.Start(ctxT(t, 5*time.Second), req)
	if err == nil {
		_, err = collect(t, stream)
	}
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("missing cwd: got %v", err)
	}
	_, err = ta.proc.SendSignal(ctxT(t, 5*time.Second), connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: 999999}}, Signal: pb.Signal_SIGNAL_SIGKILL}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("unknown pid: got %v", err)
	}
}

func TestProcessEnvironment(t *testing.T) {
	ta := newTestAgent(t)
	resp, err := ta.http.Post(ta.base+"/init", "application/json", strings.NewReader(`{"envVars":{"SB":"sandbox","OVER":"sb"}}`))
	if err != nil || resp.StatusCode != 204 {
		t.Fatalf("init: %v %v", err, resp)
	}
	req := startReq("/usr/bin/env")
	req.Msg.Process.Envs = map[string]string{"OVER": "req", "REQ": "1"}
	stream, err := ta.proc.Start(ctxT(t, 10*time.Second), req)
	if err != nil {
		t.Fatal(err)
	}
	r, err := collect(t, stream)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSpace(string(r.stdout)), "\n")
	want := []string{"HOME=/root", "LOGNAME=root", "OVER=req", "PATH=/usr/local/bin:/usr/bin:/bin", "REQ=1", "SB=sandbox", "USER=root"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("env = %q, want %q", got, want)
	}
}

func TestProcessUser(t *testing.T) {
	ta := newTestAgent(t)
	ta.header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("nobody:")))
	stream, err := ta.proc.Start(ctxT(t, 10*time.Second), startReq("/bin/sh", "-c", `id -u; id -g; id -G; pwd; echo $HOME $USER`))
	if err != nil {
		t.Fatal(err)
	}
	r, err := collect(t, stream)
	if err != nil {
		t.Fatal(err)
	}
	want := "65534\n65534\n65534 4242\n" + ta.home + "\n" + ta.home + " nobody\n"
	if string(r.stdout) != want {
		t.Fatalf("got %q want %q (stderr %q)", r.stdout, want, r.stderr)
	}
}

func TestPTY(t *testing.T) {
	ta := newTestAgent(t)
	ctx := ctxT(t, 15*time.Second)
	tag := "term"
	req := connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/sh", Envs: map[string]string{"TERM": "xterm-256color", "PS1": "$ "}},
		Pty:     &pb.PTY{Size: &pb.PTY_Size{Cols: 80, Rows: 24}},
		Tag:     &tag,
	})
	stream, err := ta.proc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	pid := firstPid(t, stream)
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	send := func(s string) {
		t.Helper()
		if _, err := ta.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte(s)}}})); err != nil {
			t.Fatal(err)
		}
	}
	send("stty size; tty >/dev/null && echo TTY$((6*7))\n")
	var early []byte
	for !bytes.Contains(early, []byte("TTY42")) {
		if !stream.Receive() {
			t.Fatalf("stream ended early: %v (output %q)", stream.Err(), early)
		}
		early = append(early, stream.Msg().GetEvent().GetData().GetPty()...)
	}
	if _, err := ta.proc.Update(ctx, connect.NewRequest(&pb.UpdateRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: tag}}, Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 100, Rows: 30}}})); err != nil {
		t.Fatal(err)
	}
	send("stty size; exit 7\n")
	r, err := collect(t, stream)
	if err != nil {
		t.Fatal(err)
	}
	out := string(early) + string(r.pty)
	if !strings.Contains(string(early), "24 80") {
		t.Fatalf("initial size missing in %q", early)
	}
	for _, w := range []string{"24 80", "TTY42", "30 100"} {
		if !strings.Contains(out, w) {
			t.Fatalf("pty output %q lacks %q", out, w)
		}
	}
	if r.end == nil || r.end.ExitCode != 7 {
		t.Fatalf("end = %v", r.end)
	}
}

func TestStdinInputAndClose(t *testing.T) {
	ta := newTestAgent(t)
	ctx := ctxT(t, 10*time.Second)
	stdin := true
	req := startReq("/bin/cat")
	req.Msg.Stdin = &stdin
	stream, err := ta.proc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	pid := firstPid(t, stream)
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	if _, err := ta.proc.SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("hello ")}}})); err != nil {
		t.Fatal(err)
	}
	// StreamInput: start, data, keepalive, data.
	cs := ta.proc.StreamInput(ctx)
	msgs := []*pb.StreamInputRequest{
		{Event: &pb.StreamInputRequest_Start{Start: &pb.StreamInputRequest_StartEvent{Process: sel}}},
		{Event: &pb.StreamInputRequest_Data{Data: &pb.StreamInputRequest_DataEvent{Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("stream")}}}}},
		{Event: &pb.StreamInputRequest_Keepalive{Keepalive: &pb.StreamInputRequest_KeepAlive{}}},
		{Event: &pb.StreamInputRequest_Data{Data: &pb.StreamInputRequest_DataEvent{Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("ed")}}}}},
	}
	for _, m := range msgs {
		if err := cs.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cs.CloseAndReceive(); err != nil {
		t.Fatal(err)
	}
	if _, err := ta.proc.CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	r, err := collect(t, stream)
	if err != nil {
		t.Fatal(err)
	}
	if string(r.stdout) != "hello streamed" || r.end == nil || r.end.ExitCode != 0 {
		t.Fatalf("stdout=%q end=%v", r.stdout, r.end)
	}

	// Without stdin, the process reads EOF at once.
	no := false
	req = startReq("/bin/cat")
	req.Msg.Stdin = &no
	stream, err = ta.proc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if r, err = collect(t, stream); err != nil || r.end == nil || r.end.ExitCode != 0 {
		t.Fatalf("cat without stdin: %v %v", err, r.end)
	}
}

func TestListConnectSignal(t *testing.T) {
	ta := newTestAgent(t)
	ctx := ctxT(t, 15*time.Second)
	tag := "sleeper"
	req := startReq("/bin/sh", "-c", "echo started; sleep 30")
	req.Msg.Tag = &tag
	stream, err := ta.proc.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	pid := firstPid(t, stream)
	if !stream.Receive() || string(stream.Msg().GetEvent().GetData().GetStdout()) != "started\n" {
		t.Fatalf("expected output: %v %v", stream.Msg(), stream.Err())
	}
	list, err := ta.proc.List(ctx, connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range list.Msg.Processes {
		if p.Pid == pid && p.GetTag() == tag && p.Config.GetCmd() == "/bin/sh" {
			found = true
		}
	}
	if !found {
		t.Fatalf("pid %d not in list %v", pid, list.Msg.Processes)
	}
	cstream, err := ta.proc.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: tag}}}))
	if err != nil {
		t.Fatal(err)
	}
	if got := firstPid(t, cstream); got != pid {
		t.Fatalf("connect start pid %d want %d", got, pid)
	}
	if _, err := ta.proc.SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	for name, res := range map[string]func() (result, error){
		"start":   func() (result, error) { return collect(t, stream) },
		"connect": func() (result, error) { return collect(t, cstream) },
	} {
		r, err := res()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if r.end == nil || r.end.Exited || r.end.Status != "signal: killed" || r.end.ExitCode != -1 {
			t.Fatalf("%s end = %v", name, r.end)
		}
	}
	_, err = ta.proc.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}}))
	if err == nil {
		cs, _ := ta.proc.Connect(ctx, connect.NewRequest(&pb.ConnectRequest{Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}}))
		_, err = collect(t, cs)
	}
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("connect to ended process: %v", err)
	}
}

func TestKeepalive(t *testing.T) {
	ta := newTestAgent(t)
	ta.header.Set("Keepalive-Ping-Interval", "1")
	stream, err := ta.proc.Start(ctxT(t, 10*time.Second), startReq("/bin/sleep", "2.5"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := collect(t, stream)
	if err != nil {
		t.Fatal(err)
	}
	if r.keepalives < 2 || r.end == nil || r.end.ExitCode != 0 {
		t.Fatalf("keepalives=%d end=%v", r.keepalives, r.end)
	}
}

func TestTimeoutKillsProcess(t *testing.T) {
	ta := newTestAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	stream, err := ta.proc.Start(ctx, startReq("/bin/sleep", "60"))
	if err != nil {
		t.Fatal(err)
	}
	pid := firstPid(t, stream)
	_, err = collect(t, stream)
	if err == nil {
		t.Fatal("expected the stream to end with a deadline error")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := syscall.Kill(int(pid), 0)
		if errors.Is(err, syscall.ESRCH) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d still alive after the request deadline", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// And it is gone from the table.
	time.Sleep(200 * time.Millisecond)
	list, err := ta.proc.List(context.Background(), connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Msg.Processes {
		if p.Pid == pid {
			t.Fatalf("pid %d still listed", pid)
		}
	}
}

func TestLargeOutputIntact(t *testing.T) {
	ta := newTestAgent(t)
	data := make([]byte, 10<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(ta.dir, "big")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	stream, err := ta.proc.Start(ctxT(t, 60*time.Second), startReq("/bin/cat", path))
	if err != nil {
		t.Fatal(err)
	}
	r, err := collect(t, stream)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r.stdout, data) {
		t.Fatalf("got %d bytes, want %d identical bytes", len(r.stdout), len(data))
	}
	if r.end == nil || r.end.ExitCode != 0 {
		t.Fatalf("end = %v", r.end)
	}
}

func TestBackgroundChildDoesNotBlockEnd(t *testing.T) {
	ta := newTestAgent(t)
	start := time.Now()
	stream, err := ta.proc.Start(ctxT(t, 10*time.Second), startReq("/bin/sh", "-c", "sleep 5 & echo done"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := collect(t, stream)
	if err != nil {
		t.Fatal(err)
	}
	if string(r.stdout) != "done\n" || r.end == nil || time.Since(start) > 3*time.Second {
		t.Fatalf("stdout=%q end=%v after %v", r.stdout, r.end, time.Since(start))
	}
}

// A client that disconnects (the SDK's disconnect()) must leave the process
// running; only the Connect-Timeout-Ms deadline ends it.
func TestDisconnectKeepsProcess(t *testing.T) {
	ta := newTestAgent(t)
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := ta.proc.Start(ctx, startReq("/bin/sleep", "30"))
	if err != nil {
		t.Fatal(err)
	}
	pid := firstPid(t, stream)
	cancel()
	stream.Close()
	time.Sleep(300 * time.Millisecond)
	list, err := ta.proc.List(ctxT(t, 5*time.Second), connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range list.Msg.Processes {
		found = found || p.Pid == pid
	}
	if !found {
		t.Fatalf("pid %d was killed when its client disconnected", pid)
	}
	if _, err := ta.proc.SendSignal(ctxT(t, 5*time.Second), connect.NewRequest(&pb.SendSignalRequest{
		Process: &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}, Signal: pb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
}
