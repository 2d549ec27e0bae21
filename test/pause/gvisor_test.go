package pause

import (
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

func sleep(ms int) { time.Sleep(time.Duration(ms) * time.Millisecond) }

// TestMemoryPauseGvisor: a base-gvisor sandbox pauses with its memory: a
// running process (same pid) and its Python variable continue after resume,
// also after nook serve is killed and restarted.
func TestMemoryPauseGvisor(t *testing.T) {
	if _, err := exec.LookPath("runsc"); err != nil {
		t.Fatal("runsc not installed (scripts/install-deps.sh installs it from bookworm-backports)")
	}
	id := create(t, map[string]any{"templateID": "base-gvisor"})
	run(t, id, `setsid nohup python3 -c '
import os, time
counter = 0
while True:
    counter += 1
    open("/tmp/state", "w").write("%d %d" % (os.getpid(), counter))
    time.sleep(0.05)
' >/dev/null 2>&1 & sleep 1`)
	run(t, id, "echo disk > /home/user/disk")
	before := strings.Fields(run(t, id, "cat /tmp/state"))
	took := pause(t, id, nil)
	d := info(t, id)
	if d.PauseMode != "memory" {
		t.Fatalf("gvisor sandbox paused in mode %q (%s)", d.PauseMode, d.PauseNote)
	}
	t.Logf("memory pause took %s", took)
	srv.Kill()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	status, took := connect(t, id)
	if status != http.StatusCreated {
		t.Fatalf("connect: %d", status)
	}
	t.Logf("memory resume took %s", took)
	sleep(300)
	after := strings.Fields(run(t, id, "cat /tmp/state"))
	if len(before) != 2 || len(after) != 2 || after[0] != before[0] {
		t.Fatalf("the process did not continue: before %v after %v", before, after)
	}
	if n0, _ := strconv.Atoi(before[1]); func() bool { n1, _ := strconv.Atoi(after[1]); return n1 <= n0 }() {
		t.Errorf("the counter did not continue from its value: before %v after %v", before, after)
	}
	if got := run(t, id, "cat /home/user/disk"); got != "disk\n" {
		t.Errorf("file after memory resume: %q", got)
	}
	// Filesystem-only pause of a gvisor sandbox restarts it.
	pause(t, id, new(bool))
	if d := info(t, id); d.PauseMode != "filesystem" {
		t.Errorf("memory=false pause mode %q", d.PauseMode)
	}
	connect(t, id)
	s1 := run(t, id, "cat /tmp/state 2>/dev/null || echo gone")
	sleep(300)
	if s2 := run(t, id, "cat /tmp/state 2>/dev/null || echo gone"); s1 != s2 {
		t.Errorf("after a filesystem resume the old process still runs: %q then %q", s1, s2)
	}
}
