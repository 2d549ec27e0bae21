package native_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	nook "github.com/nookhq/nook/sdk/go"
)

// screen accumulates a terminal attachment's output.
type screen struct {
	t    *testing.T
	conn *nook.TerminalConn
	buf  strings.Builder
	eof  bool
}

// until reads until the output since the last call contains want.
func (s *screen) until(want string, d time.Duration) string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := s.buf.Len()
	for !strings.Contains(s.buf.String()[start:], want) {
		data, err := s.conn.Read(ctx)
		if errors.Is(err, io.EOF) {
			s.eof = true
			break
		}
		if err != nil {
			s.t.Fatalf("waiting for %q: %v; screen since: %q", want, err, s.buf.String()[start:])
		}
		s.buf.Write(data)
	}
	got := s.buf.String()[start:]
	if !strings.Contains(got, want) {
		s.t.Fatalf("terminal ended before %q; screen since: %q", want, got)
	}
	return got
}

func (s *screen) typeLine(line string) {
	s.t.Helper()
	if err := s.conn.Write(context.Background(), []byte(line+"\n")); err != nil {
		s.t.Fatal(err)
	}
}

// Terminals: image env + launch env + TERM=xterm-256color, no stored names;
// a real shell over the WebSocket (type, resize, read back); export stays in
// the terminal; replay on re-attach; interrupt; exit code.
func TestTerminalOverWebSocket(t *testing.T) {
	sb := named(t, envTemplate)
	ctx := ctxT(t, 2*time.Minute)
	if _, err := sb.SetEnvVars(ctx, nook.Vars{"STORED_X": nook.Str("stored")}); err != nil {
		t.Fatal(err)
	}
	term, err := sb.CreateTerminal(ctx, &nook.TerminalOptions{
		Command: []string{"bash"}, Cwd: "/tmp",
		Env: nook.Vars{"APP_HOME": nook.Str("/workspace/app"), "IMG_ONLY": nil},
	})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := term.Attach(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &screen{t: t, conn: conn}
	s.typeLine(`echo "T:$TERM:$APP_HOME:${STORED_X-unset}:$DEMO_ENV:${IMG_ONLY-unset}:$(pwd):"`)
	s.until("T:xterm-256color:/workspace/app:unset:template-only:unset:/tmp:", 20*time.Second)

	// Size: default 80x24, then resize over the WebSocket and over REST.
	s.typeLine("stty size")
	s.until("24 80", 10*time.Second)
	if err := conn.Resize(ctx, 100, 30); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	s.typeLine("stty size")
	s.until("30 100", 10*time.Second)
	if err := term.Resize(ctx, 120, 40); err != nil {
		t.Fatal(err)
	}
	s.typeLine("stty size")
	s.until("40 120", 10*time.Second)
	if info, err := term.Info(ctx); err != nil || info.Cols != 120 || info.Rows != 40 {
		t.Errorf("terminal info after resize: %+v %v", info, err)
	}

	// export lasts for this terminal only.
	s.typeLine("export LEAK=from-terminal; echo leak=$LEAK.")
	s.until("leak=from-terminal.", 10*time.Second)
	if got := sh(t, sb, `echo "${LEAK-unset}"`, nil); got != "unset\n" {
		t.Errorf("terminal export reached exec: %q", got)
	}

	// Interrupt stops the foreground job.
	s.typeLine("sleep 100")
	time.Sleep(300 * time.Millisecond)
	if err := term.Interrupt(ctx); err != nil {
		t.Fatal(err)
	}
	s.typeLine("echo after-$((6*7))")
	s.until("after-42", 10*time.Second)

	// Write over REST shows up on the WebSocket too.
	if err := term.Write(ctx, []byte("echo rest-$((2+3))\n")); err != nil {
		t.Fatal(err)
	}
	s.until("rest-5", 10*time.Second)

	// Re-attach: the buffered output is replayed; since a cursor, only later output.
	conn.Close()
	conn2, err := term.Attach(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	s2 := &screen{t: t, conn: conn2}
	s2.until("T:xterm-256color:/workspace/app:", 10*time.Second)
	s2.until("rest-5", 10*time.Second)
	out, err := term.Output(ctx, nil, nil)
	if err != nil || !strings.Contains(eventsText(out), "after-42") {
		t.Errorf("terminal output: %v %q", err, eventsText(out))
	}
	cur := out.Cursor
	conn3, err := term.Attach(ctx, &nook.AttachOptions{Since: &cur})
	if err != nil {
		t.Fatal(err)
	}
	s3 := &screen{t: t, conn: conn3}
	s3.typeLine("echo fresh-$((1+1))")
	got := s3.until("fresh-2", 10*time.Second)
	if strings.Contains(got, "after-42") {
		t.Errorf("attach since a cursor replayed older output: %q", got)
	}
	conn3.Close()

	// Exit: the attachment ends with the exit status; waits and writes behave.
	s2.typeLine("exit 7")
	for !s2.eof {
		data, err := conn2.Read(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("read after exit: %v", err)
		}
		s2.buf.Write(data)
	}
	if conn2.End == nil || conn2.End.ExitCode == nil || *conn2.End.ExitCode != 7 {
		t.Errorf("end over the WebSocket: %+v", conn2.End)
	}
	st, err := term.WaitForExit(ctx, 10*time.Second)
	if err != nil || st.ExitCode == nil || *st.ExitCode != 7 {
		t.Errorf("WaitForExit: %+v %v", st, err)
	}
	if err := term.Write(ctx, []byte("x")); !nook.IsConflict(err) {
		t.Errorf("write to an exited terminal: %v, want 409", err)
	}
	if err := term.Terminate(ctx); !nook.IsConflict(err) {
		t.Errorf("terminate of an exited terminal: %v, want 409", err)
	}
	// Attaching to an exited terminal replays and ends cleanly.
	conn4, err := term.Attach(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	s4 := &screen{t: t, conn: conn4}
	s4.until("fresh-2", 10*time.Second)
	for {
		if _, err := conn4.Read(ctx); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Errorf("attach to an exited terminal: %v", err)
			}
			break
		}
	}
	list, err := sb.ListTerminals(ctx)
	if err != nil || len(list) != 1 || list[0].ID != term.ID || list[0].Running() {
		t.Errorf("ListTerminals: %+v %v", list, err)
	}
	if g, err := sb.GetTerminal(ctx, term.ID); err != nil || g.ID != term.ID {
		t.Errorf("GetTerminal: %v", err)
	}
}

func eventsText(ch nook.LogChunk) string {
	var b strings.Builder
	for _, e := range ch.Events {
		b.Write(e.Data)
	}
	return b.String()
}

// terminate hangs up the terminal (and kills it if it does not go).
func TestTerminalTerminate(t *testing.T) {
	sb := named(t, "base")
	ctx := ctxT(t, time.Minute)
	term, err := sb.CreateTerminal(ctx, &nook.TerminalOptions{Cols: 132, Rows: 50, BufferSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := term.Info(ctx); info.Cols != 132 || info.Rows != 50 || !info.Running() {
		t.Errorf("info: %+v", info)
	}
	if err := term.Write(ctx, []byte("trap '' HUP TERM; stty size\n")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if err := term.Terminate(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := term.WaitForExit(ctx, 10*time.Second)
	if err != nil || st.Running() || st.Signal == nil {
		t.Errorf("after terminate: %+v %v", st, err)
	}
	out, _ := term.Output(ctx, nil, nil)
	if !strings.Contains(eventsText(out), "50 132") {
		t.Errorf("terminal output %q lacks the size", eventsText(out))
	}
	for _, bad := range []*nook.TerminalOptions{{Cols: 70000}, {BufferSize: 10}, {Command: []string{""}}} {
		if _, err := sb.CreateTerminal(ctx, bad); !nook.IsInvalid(err) {
			t.Errorf("CreateTerminal(%+v): %v, want 400", bad, err)
		}
	}
}
