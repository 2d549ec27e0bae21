package native_test

import (
	"context"
	"strings"
	"testing"
	"time"

	nook "github.com/nookhq/nook/sdk/go"
)

// getSandbox(ns, name): first use creates, later uses reach the same one;
// names are validated.
func TestGetSandboxByName(t *testing.T) {
	ctx := ctxT(t, 2*time.Minute)
	name := "user-" + time.Now().Format("150405.000000")
	a, err := client.GetSandbox(ctx, "tests", name)
	if err != nil {
		t.Fatal(err)
	}
	created[a.ID] = true
	t.Cleanup(func() { _ = a.Destroy(context.Background()); delete(created, a.ID) })
	if !a.Created || a.Name != name || a.Namespace != "tests" || a.TemplateID != "base" {
		t.Errorf("first use: %+v", a)
	}
	b, err := client.GetSandbox(ctx, "tests", name)
	if err != nil {
		t.Fatal(err)
	}
	if b.ID != a.ID || b.Created {
		t.Errorf("second use reached %s (created %v), want %s", b.ID, b.Created, a.ID)
	}
	// Another namespace is another sandbox.
	c, err := client.GetSandbox(ctx, "tests-other", name)
	if err != nil {
		t.Fatal(err)
	}
	created[c.ID] = true
	t.Cleanup(func() { _ = c.Destroy(context.Background()); delete(created, c.ID) })
	if c.ID == a.ID {
		t.Error("namespaces do not separate names")
	}
	for _, bad := range [][2]string{{"tests", "bad name"}, {"tests", ".."}, {"tests", "-x"}, {"bad/ns", "x"}, {"tests", strings.Repeat("a", 64)}, {"tests", "a%00b"}} {
		if _, err := client.GetSandbox(ctx, bad[0], bad[1]); !nook.IsInvalid(err) && !nook.IsNotFound(err) {
			t.Errorf("GetSandbox(%q, %q) = %v, want a 400", bad[0], bad[1], err)
		}
	}
	if _, err := client.GetSandbox(ctx, "tests", "x", nook.SandboxOptions{Template: "no-such-template"}); !nook.IsNotFound(err) {
		t.Errorf("unknown template: %v, want 404", err)
	}
}

// Merge order: container environment, then setEnvVars, then this env; the
// launch env is for this launch only and does not update stored names.
func TestExecMergeOrder(t *testing.T) {
	sb := named(t, envTemplate)
	ctx := ctxT(t, time.Minute)
	if _, err := sb.SetEnvVars(ctx, nook.Vars{"NODE_ENV": nook.Str("production"), "APP_HOME": nook.Str("/workspace/app"), "LOG_LEVEL": nook.Str("info")}); err != nil {
		t.Fatal(err)
	}
	script := `echo "$NODE_ENV|$APP_HOME|$LOG_LEVEL|$DEMO_ENV|$IMG_ONLY|${PORT:-none}"`
	got := sh(t, sb, script, &nook.ExecOptions{Env: nook.Vars{"PORT": nook.Str("3000"), "LOG_LEVEL": nook.Str("debug")}})
	if want := "production|/workspace/app|debug|template-only|from-image|3000\n"; got != want {
		t.Errorf("with launch env: %q, want %q", got, want)
	}
	got = sh(t, sb, script, nil)
	if want := "production|/workspace/app|info|template-only|from-image|none\n"; got != want {
		t.Errorf("next launch: %q, want %q", got, want)
	}
	stored, err := sb.EnvVars(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stored["LOG_LEVEL"] != "info" || len(stored) != 3 {
		t.Errorf("launch env changed the stored names: %v", stored)
	}
	// cwd option.
	if got := sh(t, sb, "pwd", &nook.ExecOptions{Cwd: "/tmp"}); got != "/tmp\n" {
		t.Errorf("cwd: %q", got)
	}
}

// A null launch value removes a name (from any layer) for that launch only.
func TestLaunchNullRemoves(t *testing.T) {
	sb := named(t, envTemplate)
	ctx := ctxT(t, time.Minute)
	if _, err := sb.SetEnvVars(ctx, nook.Vars{"STORED": nook.Str("s")}); err != nil {
		t.Fatal(err)
	}
	script := `echo "${DEMO_ENV-unset}|${STORED-unset}"`
	if got := sh(t, sb, script, &nook.ExecOptions{Env: nook.Vars{"DEMO_ENV": nil, "STORED": nil}}); got != "unset|unset\n" {
		t.Errorf("null launch values: %q", got)
	}
	if got := sh(t, sb, script, nil); got != "template-only|s\n" {
		t.Errorf("next launch: %q", got)
	}
}

// setEnvVars: a string sets, null (undefined) removes a stored name.
func TestSetEnvVarsSetAndRemove(t *testing.T) {
	sb := named(t, "base")
	ctx := ctxT(t, time.Minute)
	if _, err := sb.SetEnvVars(ctx, nook.Vars{"TEMP_FLAG": nook.Str("1"), "LOG_LEVEL": nook.Str("info")}); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, sb, `echo "${TEMP_FLAG-unset}|$LOG_LEVEL"`, nil); got != "1|info\n" {
		t.Errorf("after set: %q", got)
	}
	stored, err := sb.SetEnvVars(ctx, nook.Vars{"TEMP_FLAG": nil, "LOG_LEVEL": nook.Str("debug")})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := stored["TEMP_FLAG"]; ok || stored["LOG_LEVEL"] != "debug" {
		t.Errorf("stored after remove: %v", stored)
	}
	if got := sh(t, sb, `echo "${TEMP_FLAG-unset}|$LOG_LEVEL"`, nil); got != "unset|debug\n" {
		t.Errorf("after remove: %q", got)
	}
}

// Stored names live in nook serve's memory: never on the sandbox's disk.
func TestStoredNamesNotOnDisk(t *testing.T) {
	sb := named(t, "base")
	ctx := ctxT(t, 2*time.Minute)
	secret := "stored-" + time.Now().Format("150405999999999")
	if _, err := sb.SetEnvVars(ctx, nook.Vars{"MARKER_VALUE": nook.Str(secret)}); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, sb, `echo "$MARKER_VALUE"`, nil); got != secret+"\n" {
		t.Fatalf("exec does not see the stored name: %q", got)
	}
	// Search the whole root filesystem (not /proc, /sys, /dev) for the value,
	// passing the needle split so that this command line does not match.
	out := run(t, sb, []string{"/bin/sh", "-c", `grep -rlsF --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev "$1$2" / ; echo done`, "sh", secret[:4], secret[4:]}, nil)
	if strings.TrimSpace(out.Stdout) != "done" {
		t.Errorf("the stored value was found on the sandbox's disk: %q", out.Stdout)
	}
}

// Names must be non-empty and contain no '=' or NUL: a 400, nothing stored.
func TestInvalidNames(t *testing.T) {
	sb := named(t, "base")
	ctx := ctxT(t, time.Minute)
	if _, err := sb.SetEnvVars(ctx, nook.Vars{"GOOD": nook.Str("1")}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "A=B", "=", "A\x00B"} {
		if _, err := sb.SetEnvVars(ctx, nook.Vars{bad: nook.Str("x"), "OTHER": nook.Str("y")}); !nook.IsInvalid(err) {
			t.Errorf("SetEnvVars(%q) = %v, want 400", bad, err)
		}
		if _, err := sb.Exec(ctx, []string{"true"}, &nook.ExecOptions{Env: nook.Vars{bad: nook.Str("x")}}); !nook.IsInvalid(err) {
			t.Errorf("Exec env %q = %v, want 400", bad, err)
		}
		if _, err := sb.CreateTerminal(ctx, &nook.TerminalOptions{Env: nook.Vars{bad: nook.Str("x")}}); !nook.IsInvalid(err) {
			t.Errorf("CreateTerminal env %q = %v, want 400", bad, err)
		}
	}
	if _, err := sb.SetEnvVars(ctx, nook.Vars{"V": nook.Str("a\x00b")}); !nook.IsInvalid(err) {
		t.Errorf("NUL in a value: %v, want 400", err)
	}
	stored, err := sb.EnvVars(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != 1 || stored["GOOD"] != "1" {
		t.Errorf("a rejected call changed the stored names: %v", stored)
	}
	if _, err := sb.Exec(ctx, nil, nil); !nook.IsInvalid(err) {
		t.Errorf("empty argv: %v", err)
	}
	if _, err := sb.Exec(ctx, []string{"/no/such/binary"}, nil); !nook.IsInvalid(err) {
		t.Errorf("missing binary: %v, want 400", err)
	}
}

// export inside one process never reaches the next exec.
func TestExportDoesNotLeak(t *testing.T) {
	sb := named(t, "base")
	sh(t, sb, "export LEAKY=1; echo $LEAKY", nil)
	if got := sh(t, sb, `echo "${LEAKY-unset}"`, nil); got != "unset\n" {
		t.Errorf("export leaked into the next exec: %q", got)
	}
}

// Handles: id, pid, status, logs with cursor, output, kill.
func TestProcessHandle(t *testing.T) {
	sb := named(t, "base")
	ctx := ctxT(t, time.Minute)
	p, err := sb.Exec(ctx, []string{"/bin/sh", "-c", "echo out; echo err >&2; sleep 0.2; echo more; exit 3"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.ID == "" || p.Pid == 0 {
		t.Fatalf("handle: %+v", p)
	}
	out, err := p.Output(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if out.Stdout != "out\nmore\n" || out.Stderr != "err\n" || out.ExitCode == nil || *out.ExitCode != 3 || out.Truncated || out.TimedOut {
		t.Errorf("output: %+v", out)
	}
	st, err := p.Status(ctx)
	if err != nil || st.State != "exited" || *st.ExitCode != 3 || st.EndedAt == nil {
		t.Errorf("status: %+v %v", st, err)
	}
	// Logs: all retained, then from a cursor.
	all, err := p.Logs(ctx, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Events) != 3 || all.End == nil {
		t.Fatalf("logs: %+v", all)
	}
	since := all.Events[0].Cursor
	rest, err := p.Logs(ctx, &nook.LogsOptions{Since: &since}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rest.Events) != 2 || rest.Events[0].Cursor != all.Events[1].Cursor {
		t.Errorf("logs since %d: %+v", since, rest)
	}
	onlyErr, _ := p.Logs(ctx, &nook.LogsOptions{Stream: "stderr"}, nil)
	if len(onlyErr.Events) != 1 || string(onlyErr.Events[0].Data) != "err\n" {
		t.Errorf("stderr logs: %+v", onlyErr)
	}
	// Follow on a process that ended: the retained events and the end, promptly.
	var chunks int
	last, err := p.Logs(ctx, &nook.LogsOptions{Follow: true}, func(nook.LogChunk) error { chunks++; return nil })
	if err != nil || last.End == nil || *last.End.ExitCode != 3 {
		t.Errorf("follow on an ended process: %+v %v", last, err)
	}
	// Kill of a finished process: a clear 409.
	if err := p.Kill(ctx, 9); !nook.IsConflict(err) {
		t.Errorf("kill of a finished process: %v, want 409", err)
	}
	// getProcess / listProcesses.
	if q, err := sb.GetProcess(ctx, p.ID); err != nil || q.Pid != p.Pid {
		t.Errorf("GetProcess: %+v %v", q, err)
	}
	list, err := sb.ListProcesses(ctx)
	if err != nil || len(list) == 0 || list[len(list)-1].ID != p.ID {
		t.Errorf("ListProcesses: %+v %v", list, err)
	}
}

// Follow streams live output with cursors until the process ends.
func TestLogsFollowLive(t *testing.T) {
	sb := named(t, "base")
	ctx := ctxT(t, time.Minute)
	p, err := sb.Exec(ctx, []string{"/bin/sh", "-c", "for i in 1 2 3; do echo line$i; sleep 0.2; done"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	var lastCursor uint64
	end, err := p.Logs(ctx, &nook.LogsOptions{Follow: true}, func(ch nook.LogChunk) error {
		for _, e := range ch.Events {
			if e.Cursor <= lastCursor {
				t.Errorf("cursor went back: %d after %d", e.Cursor, lastCursor)
			}
			lastCursor = e.Cursor
			text.Write(e.Data)
		}
		return nil
	})
	if err != nil || end.End == nil {
		t.Fatalf("follow: %+v %v", end, err)
	}
	if text.String() != "line1\nline2\nline3\n" {
		t.Errorf("followed output %q", text.String())
	}
	// replay=false on an ended process: nothing, and the end.
	nr, err := p.Logs(ctx, &nook.LogsOptions{NoReplay: true}, nil)
	if err != nil || len(nr.Events) != 0 || nr.End == nil {
		t.Errorf("no replay: %+v %v", nr, err)
	}
}

// A timeout sends SIGTERM to the process group, then SIGKILL 1 s later.
func TestExecTimeout(t *testing.T) {
	sb := named(t, "base")
	ctx := ctxT(t, time.Minute)
	start := time.Now()
	out := run(t, sb, []string{"/bin/sh", "-c", "sleep 30"}, &nook.ExecOptions{Timeout: 300 * time.Millisecond})
	if !out.TimedOut || out.Signal == nil || *out.Signal != 15 {
		t.Errorf("timed-out sleep: %+v", out)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("timeout took %s", d)
	}
	// A process group ignoring SIGTERM is killed a second later.
	start = time.Now()
	p, err := sb.Exec(ctx, []string{"/bin/sh", "-c", "trap '' TERM; sleep 30 & wait; sleep 30"}, &nook.ExecOptions{Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.WaitForExit(ctx, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	d := time.Since(start)
	if !st.TimedOut || st.Signal == nil || *st.Signal != 9 || d < time.Second || d > 6*time.Second {
		t.Errorf("TERM-ignoring process: %+v after %s", st, d)
	}
	// The whole group is gone (the background sleep too).
	if got := sh(t, sb, `ps -eo args | grep -c '^sleep 30' || true`, nil); strings.TrimSpace(got) != "0" {
		t.Errorf("sleep 30 processes left: %s", got)
	}
}

// kill(signal) and the status it leaves.
func TestKillSignal(t *testing.T) {
	sb := named(t, "base")
	ctx := ctxT(t, time.Minute)
	p, err := sb.Exec(ctx, []string{"sleep", "30"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := p.Status(ctx); st.State != "running" {
		t.Errorf("status before kill: %+v", st)
	}
	if _, err := p.WaitForExit(ctx, 200*time.Millisecond); !nook.IsTimeout(err) {
		t.Errorf("WaitForExit on a running process: %v, want a timeout", err)
	}
	if err := p.Kill(ctx, 2); err != nil {
		t.Fatal(err)
	}
	st, err := p.WaitForExit(ctx, 10*time.Second)
	if err != nil || st.Signal == nil || *st.Signal != 2 || st.SignalName != "SIGINT" || st.TimedOut {
		t.Errorf("after kill(2): %+v %v", st, err)
	}
	if err := p.Kill(ctx, 0); !nook.IsConflict(err) {
		t.Errorf("second kill: %v, want 409", err)
	}
	if err := p.Kill(ctx, 99); !nook.IsInvalid(err) {
		t.Errorf("kill(99): %v, want 400", err)
	}
}

// waitForLog(regex, stream) and waitForPort.
func TestWaitForLogAndPort(t *testing.T) {
	sb := named(t, "base")
	ctx := ctxT(t, time.Minute)
	p, err := sb.Exec(ctx, []string{"/bin/sh", "-c", "sleep 0.3; echo 'noise'; echo 'listening on port 8765' >&2; exec python3 -m http.server 8765 --bind 127.0.0.1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := p.WaitForLog(ctx, `listening on port (\d+)`, "stderr", 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if m.Stream != "stderr" || len(m.Groups) != 2 || m.Groups[1] != "8765" {
		t.Errorf("match: %+v", m)
	}
	if _, err := p.WaitForLog(ctx, `listening`, "stdout", 500*time.Millisecond); !nook.IsTimeout(err) {
		t.Errorf("pattern on the wrong stream: %v, want a timeout", err)
	}
	if err := p.WaitForPort(ctx, 8765, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, sb, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8765/", nil); got != "200" {
		t.Errorf("server answers %q", got)
	}
	if err := p.Kill(ctx, 15); err != nil {
		t.Fatal(err)
	}
	// Waits on a process that ended fail cleanly, never hang.
	q, err := sb.Exec(ctx, []string{"true"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.WaitForLog(ctx, "never", "", 0); !nook.IsConflict(err) {
		t.Errorf("WaitForLog on an ended process: %v, want 409", err)
	}
	if err := q.WaitForPort(ctx, 8799, 0); !nook.IsConflict(err) {
		t.Errorf("WaitForPort on an ended process: %v, want 409", err)
	}
	if _, err := q.WaitForLog(ctx, "(", "", 0); !nook.IsInvalid(err) {
		t.Errorf("bad regex: %v, want 400", err)
	}
}

// output({maxBytes}) truncates; retention keeps 1 MiB per process.
func TestOutputTruncationAndRetention(t *testing.T) {
	sb := named(t, "base")
	ctx := ctxT(t, time.Minute)
	p, err := sb.Exec(ctx, []string{"/bin/sh", "-c", "head -c 5000 /dev/zero | tr '\\0' a"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := p.Output(ctx, &nook.OutputOptions{MaxBytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Stdout) != 100 || !out.Truncated {
		t.Errorf("maxBytes 100: %d bytes, truncated %v", len(out.Stdout), out.Truncated)
	}
	full, _ := p.Output(ctx, nil)
	if len(full.Stdout) != 5000 || full.Truncated {
		t.Errorf("full: %d bytes, truncated %v", len(full.Stdout), full.Truncated)
	}
	// 3 MiB of output: only the last 1 MiB is kept, and that is said.
	big, err := sb.Exec(ctx, []string{"/bin/sh", "-c", "head -c 3145728 /dev/zero | tr '\\0' b; echo END"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	bo, err := big.Output(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bo.Truncated || len(bo.Stdout) > 1<<20 || !strings.HasSuffix(bo.Stdout, "END\n") {
		t.Errorf("retention: %d bytes kept, truncated %v", len(bo.Stdout), bo.Truncated)
	}
	zero := uint64(0)
	lg, err := big.Logs(ctx, &nook.LogsOptions{Since: &zero}, nil)
	if err != nil || !lg.Gap {
		t.Errorf("logs since 0 after drops: gap %v err %v", lg.Gap, err)
	}
	// output with a timeout on a running process: a clear timeout.
	long, err := sb.Exec(ctx, []string{"sleep", "30"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := long.Output(ctx, &nook.OutputOptions{Timeout: 200 * time.Millisecond}); !nook.IsTimeout(err) {
		t.Errorf("output timeout: %v", err)
	}
	_ = long.Kill(ctx, 9)
}

// 64 finished records per sandbox; running ones are always kept.
func TestFinishedRetention(t *testing.T) {
	sb := named(t, "base")
	ctx := ctxT(t, 3*time.Minute)
	runner, err := sb.Exec(ctx, []string{"sleep", "60"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var first string
	for i := 0; i < 70; i++ {
		p, err := sb.Exec(ctx, []string{"true"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.WaitForExit(ctx, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = p.ID
		}
	}
	list, err := sb.ListProcesses(ctx)
	if err != nil {
		t.Fatal(err)
	}
	finished, running := 0, 0
	for _, p := range list {
		if p.Running() {
			running++
		} else {
			finished++
		}
	}
	if finished != 64 || running != 1 {
		t.Errorf("list: %d finished, %d running; want 64 and 1", finished, running)
	}
	if _, err := sb.GetProcess(ctx, first); !nook.IsNotFound(err) {
		t.Errorf("oldest finished record: %v, want 404", err)
	}
	if _, err := sb.GetProcess(ctx, runner.ID); err != nil {
		t.Errorf("running process forgotten: %v", err)
	}
	_ = runner.Kill(ctx, 9)
}

// Unknown ids and sandboxes: clear 404s.
func TestUnknownIDs(t *testing.T) {
	sb := named(t, "base")
	ctx := ctxT(t, time.Minute)
	if _, err := sb.GetProcess(ctx, "p_nope"); !nook.IsNotFound(err) {
		t.Errorf("unknown process: %v", err)
	}
	if _, err := sb.GetTerminal(ctx, "t_nope"); !nook.IsNotFound(err) {
		t.Errorf("unknown terminal: %v", err)
	}
	ghost := client.SandboxByID("inosuchsandbox00000000")
	if _, err := ghost.Exec(ctx, []string{"true"}, nil); !nook.IsNotFound(err) {
		t.Errorf("exec in an unknown sandbox: %v", err)
	}
	if _, err := ghost.SetEnvVars(ctx, nook.Vars{"A": nook.Str("1")}); !nook.IsNotFound(err) {
		t.Errorf("setEnvVars on an unknown sandbox: %v", err)
	}
}

// A destroyed sandbox's native state is dropped; its handles end cleanly.
func TestDestroyDropsState(t *testing.T) {
	sb := named(t, "base")
	ctx := ctxT(t, time.Minute)
	if _, err := sb.SetEnvVars(ctx, nook.Vars{"A": nook.Str("1")}); err != nil {
		t.Fatal(err)
	}
	p, err := sb.Exec(ctx, []string{"sleep", "60"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := p.Logs(ctx, &nook.LogsOptions{Follow: true}, nil)
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	if err := sb.Destroy(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("follow did not end when the sandbox was destroyed")
	}
	if _, err := sb.EnvVars(ctx); !nook.IsNotFound(err) {
		t.Errorf("env of a destroyed sandbox: %v", err)
	}
	if _, err := sb.GetProcess(ctx, p.ID); !nook.IsNotFound(err) {
		t.Errorf("process of a destroyed sandbox: %v", err)
	}
}
