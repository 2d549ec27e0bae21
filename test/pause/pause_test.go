package pause

import (
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// writeState leaves files the writable layer must keep, including a
// deleted template file (a whiteout) and a replaced directory (opaque).
const writeState = `set -e
echo hello > /home/user/f.txt
chown user:user /home/user/f.txt
mkdir -p /opt/data && echo owned > /opt/data/o && chown 1000:1000 /opt/data/o
rm /etc/motd
rm -rf /etc/skel && mkdir /etc/skel && echo fresh > /etc/skel/new
setfattr -n user.k -v v /home/user/f.txt 2>/dev/null || true`

const checkState = `set -e
cat /home/user/f.txt
stat -c '%U %u' /home/user/f.txt /opt/data/o
test ! -e /etc/motd && echo motd-gone
ls -A /etc/skel`

func TestPauseResumeKeepsFilesAndFreesMemory(t *testing.T) {
	id := create(t, map[string]any{"envVars": map[string]string{"PAUSE_ENV": "kept"}})
	run(t, id, writeState)
	before := run(t, id, checkState)
	cg := memCgroup(id)
	if cg == "" {
		t.Fatalf("no memory cgroup for running sandbox %s", id)
	}
	usage, _ := os.ReadFile(cg + "/memory.usage_in_bytes")
	if len(usage) == 0 {
		usage, _ = os.ReadFile(cg + "/memory.current")
	}
	t.Logf("memory cgroup usage while running: %s", strings.TrimSpace(string(usage)))

	took := pause(t, id, nil)
	t.Logf("pause (filesystem) took %s", took)
	want(t, api(t, "POST", "/sandboxes/"+id+"/pause", map[string]any{}), http.StatusConflict, "second pause")
	d := info(t, id)
	if d.State != "paused" || d.PauseMode != "filesystem" || d.PauseNote == "" {
		t.Fatalf("paused sandbox info: %+v", d)
	}
	if cg := memCgroup(id); cg != "" {
		t.Errorf("paused sandbox still has a memory cgroup %s", cg)
	}
	if m := mountsOf(id); len(m) > 0 {
		t.Errorf("paused sandbox still has mounts (its tmpfs must be gone): %v", m)
	}
	if !has(listIDs(t, "paused"), id) || has(listIDs(t, "running"), id) {
		t.Errorf("state filters: paused=%v running=%v", listIDs(t, "paused"), listIDs(t, "running"))
	}
	// Traffic to a paused sandbox without autoResume is refused, not resumed.
	r, err := doErr("GET", proxyURL+"/health", nil, map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983"})
	if err != nil || r.Status != http.StatusConflict {
		t.Errorf("proxy to a paused sandbox without autoResume: %v %v", r, err)
	}
	// Commands need a running sandbox.
	if _, err := tryRun(id, "true"); err == nil {
		t.Errorf("a command ran in a paused sandbox")
	}

	status, took := connect(t, id)
	if status != http.StatusCreated {
		t.Fatalf("connect to a paused sandbox: want 201, got %d", status)
	}
	t.Logf("resume (filesystem) took %s", took)
	if after := run(t, id, checkState); after != before {
		t.Errorf("files after resume:\n%s\nwant:\n%s", after, before)
	}
	if got := run(t, id, "hostname; echo $PAUSE_ENV"); got != id+"\nkept\n" {
		t.Errorf("hostname/env after resume: %q", got)
	}
	if status, _ := connect(t, id); status != http.StatusOK {
		t.Errorf("connect to a running sandbox: want 200, got %d", status)
	}
	want(t, api(t, "POST", "/sandboxes/"+id+"/resume", map[string]any{}), http.StatusConflict, "resume of a running sandbox")
	// Pause and resume again through the CLI.
	out := cli(t, "sandbox", "pause", id)
	if !strings.Contains(out, "paused (filesystem)") {
		t.Errorf("nook sandbox pause: %q", out)
	}
	cli(t, "sandbox", "resume", id)
	if after := run(t, id, checkState); after != before {
		t.Errorf("files after the second resume:\n%s", after)
	}
}

func TestResumeAfterServeKilled(t *testing.T) {
	id := create(t, nil)
	run(t, id, writeState)
	before := run(t, id, checkState)
	pause(t, id, nil)
	srv.Kill()
	if err := srv.Start(); err != nil {
		t.Fatalf("restart nook serve: %v", err)
	}
	if d := info(t, id); d.State != "paused" {
		t.Fatalf("after a restart the paused sandbox is %q", d.State)
	}
	if status, _ := connect(t, id); status != http.StatusCreated {
		t.Fatalf("connect after restart: %d", status)
	}
	if after := run(t, id, checkState); after != before {
		t.Errorf("files after restart + resume:\n%s\nwant:\n%s", after, before)
	}
}

func TestAutoPauseAndAutoResume(t *testing.T) {
	// lifecycle.onTimeout 'pause' + autoResume: traffic resumes it.
	a := create(t, map[string]any{"timeout": 2, "autoPause": true, "autoPauseMemory": false, "autoResume": map[string]bool{"enabled": true}})
	// onTimeout 'pause' without autoResume: connect resumes it.
	b := create(t, map[string]any{"timeout": 2, "autoPause": true})
	run(t, a, "echo a > /home/user/a")
	run(t, b, "echo b > /home/user/b")
	if d := info(t, a); d.Lifecycle.OnTimeout != "pause" || !d.Lifecycle.AutoResume {
		t.Errorf("lifecycle of a: %+v", d.Lifecycle)
	}
	waitState(t, a, "paused", 20*time.Second)
	waitState(t, b, "paused", 20*time.Second)

	r, err := doErr("GET", proxyURL+"/health", nil, map[string]string{"E2b-Sandbox-Id": a, "E2b-Sandbox-Port": "49983"})
	if err != nil || r.Status >= 300 {
		t.Fatalf("traffic to an auto-resuming paused sandbox: %v %v", r, err)
	}
	if d := info(t, a); d.State != "running" {
		t.Fatalf("after traffic, sandbox a is %s", d.State)
	}
	if got := run(t, a, "cat /home/user/a"); got != "a\n" {
		t.Errorf("a's file after auto-resume: %q", got)
	}

	r, _ = doErr("GET", proxyURL+"/health", nil, map[string]string{"E2b-Sandbox-Id": b, "E2b-Sandbox-Port": "49983"})
	if r.Status != http.StatusConflict || info(t, b).State != "paused" {
		t.Errorf("traffic to a paused sandbox without autoResume: %s, state %s", r, info(t, b).State)
	}
	if status, _ := connect(t, b); status != http.StatusCreated {
		t.Fatalf("connect b: %d", status)
	}
	if got := run(t, b, "cat /home/user/b"); got != "b\n" {
		t.Errorf("b's file after connect: %q", got)
	}
}
