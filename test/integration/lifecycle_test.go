package integration

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestKillRemovesEverything: a killed sandbox leaves no mount, cgroup,
// process, directory or runc container.
func TestKillRemovesEverything(t *testing.T) {
	id := createSandbox(t)
	mustRun(t, id, "root", "nohup sleep 4321 >/dev/null 2>&1 & mount | head -1 >/dev/null; echo data > /tmp/f; echo data > /root/f")
	mustRun(t, id, "user", "nohup sleep 4322 >/dev/null 2>&1 &")
	// Positive control: while it runs, the checks see its resources.
	held := strings.Join(leftovers(id), "\n")
	for _, want := range []string{"mount " + filepath.Join(dataDir, "bundles", id), "cgroup ", "process ", "path " + filepath.Join(dataDir, "run", id), "runc container " + id} {
		if !strings.Contains(held, want) {
			t.Errorf("running sandbox %s: the leak check does not see %q in:\n%s", id, want, held)
		}
	}
	killSandbox(t, id)
	requireNoLeftovers(t, id)
	if r := api(t, "GET", "/sandboxes/"+id, nil); r.Status != http.StatusNotFound {
		t.Errorf("GET /sandboxes/%s after kill: %s, want 404", id, r)
	}
	if r := api(t, "DELETE", "/sandboxes/"+id, nil); r.Status != http.StatusNotFound {
		t.Errorf("second DELETE /sandboxes/%s: %s, want 404", id, r)
	}
	if slices.Contains(listSandboxIDs(t), id) {
		t.Errorf("GET /sandboxes still lists killed sandbox %s", id)
	}
}

// TestServeSIGKILLRecovery: nook serve dies with SIGKILL while sandboxes
// run; on the next start each sandbox is either re-adopted (and works) or
// reported gone with nothing left of it. A sandbox whose PID 1 died while
// nook was down and leftovers of an unknown sandbox are cleaned up.
func TestServeSIGKILLRecovery(t *testing.T) {
	a := createSandbox(t)
	b := createSandbox(t)
	c := createSandbox(t)
	mustRun(t, a, "user", "nohup sleep 7777 >/dev/null 2>&1 & echo before > /home/user/state")
	mustRun(t, b, "user", "echo before > /home/user/state")
	cPid := sandboxPid(t, c)
	// Warm (pooled, unlisted) sandboxes nook holds now: after the restart
	// they are leftovers of the dead process and must be gone too.
	before := settledSnapshot(t)
	var pooled []string
	for _, b := range before.bundles {
		if !slices.Contains(before.ids, b) {
			pooled = append(pooled, b)
		}
	}

	srv.Kill()
	restarted := false
	defer func() {
		if !restarted {
			// Keep the rest of the suite running.
			if err := srv.Start(); err != nil {
				t.Errorf("restart nook serve: %v", err)
			}
		}
	}()
	// While nook is down: c's PID 1 dies, and leftovers of a sandbox nook
	// never knew of appear.
	if err := syscall.Kill(cPid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill sandbox %s's PID 1 (%d): %v", c, cPid, err)
	}
	for i := 0; i < 100; i++ {
		if _, err := os.Stat("/proc/" + strconv.Itoa(cPid)); err != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	stray := "izzzzstrayleftover0001"
	for _, d := range []string{filepath.Join(dataDir, "bundles", stray), filepath.Join(dataDir, "run", stray)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		os.RemoveAll(filepath.Join(dataDir, "bundles", stray))
		os.RemoveAll(filepath.Join(dataDir, "run", stray))
	})

	restarted = true
	if err := srv.Start(); err != nil {
		t.Fatalf("restart nook serve after SIGKILL: %v", err)
	}

	listed := listSandboxIDs(t)
	for _, id := range []string{a, b} {
		r := api(t, "GET", "/sandboxes/"+id, nil)
		switch r.Status {
		case http.StatusOK:
			if !slices.Contains(listed, id) {
				t.Errorf("sandbox %s answers GET but is not in GET /sandboxes %v", id, listed)
			}
			got := runAs(t, id, "user", "cat /home/user/state && echo after", time.Minute)
			if got.Code != 0 || strings.Join(strings.Fields(got.Stdout), " ") != "before after" {
				t.Errorf("re-adopted sandbox %s does not work: %s", id, got)
			}
		case http.StatusNotFound:
			t.Logf("sandbox %s was not re-adopted", id)
			if slices.Contains(listed, id) {
				t.Errorf("sandbox %s is 404 but listed in GET /sandboxes", id)
			}
			requireNoLeftovers(t, id)
		default:
			t.Errorf("GET /sandboxes/%s after restart: %s, want 200 or 404", id, r)
		}
	}
	if out := mustRunIfLive(t, a, "ps -eo args"); out != "" && !strings.Contains(out, "sleep 7777") {
		t.Errorf("re-adopted sandbox %s lost its background process: %s", a, out)
	}
	// c died while nook was down: gone, and nothing of it left.
	if r := api(t, "GET", "/sandboxes/"+c, nil); r.Status != http.StatusNotFound {
		t.Errorf("GET /sandboxes/%s (PID 1 killed while nook was down): %s, want 404", c, r)
	}
	if slices.Contains(listed, c) {
		t.Errorf("GET /sandboxes lists dead sandbox %s", c)
	}
	requireNoLeftovers(t, c)
	// Leftovers of an unknown sandbox are removed, and so are the warm
	// sandboxes the killed process held (a new process cannot hand them out).
	requireNoLeftovers(t, stray)
	for _, id := range pooled {
		requireNoLeftovers(t, id)
	}

	// Killing the survivors leaves nothing.
	for _, id := range []string{a, b} {
		if r := api(t, "DELETE", "/sandboxes/"+id, nil); r.Status != http.StatusNoContent && r.Status != http.StatusNotFound {
			t.Errorf("DELETE /sandboxes/%s after restart: %s", id, r)
		}
		requireNoLeftovers(t, id)
	}
}

// mustRunIfLive runs cmd as user in id if the sandbox still exists ("" if not).
func mustRunIfLive(t testing.TB, id, cmd string) string {
	t.Helper()
	if r := api(t, "GET", "/sandboxes/"+id, nil); r.Status != http.StatusOK {
		return ""
	}
	return mustRun(t, id, "user", cmd)
}

// TestGracefulStopLeavesNoOrphans: nook serve stopped with SIGTERM leaves
// running only the sandboxes it will re-adopt (those it lists); it must not
// leave running sandboxes nobody can reach or kill until the next start,
// such as its warm pool.
func TestGracefulStopLeavesNoOrphans(t *testing.T) {
	id := createSandbox(t)
	killSandbox(t, id)
	settledSnapshot(t)
	if ids := listSandboxIDs(t); len(ids) > 0 {
		// Other sandboxes legitimately outlive the stop; this test needs none.
		for _, l := range ids {
			killQuiet(l)
		}
	}
	srv.Stop()
	restarted := false
	defer func() {
		if !restarted {
			if err := srv.Start(); err != nil {
				t.Errorf("restart nook serve: %v", err)
			}
		}
	}()
	var orphans []string
	for _, b := range dirEntries(t, filepath.Join(dataDir, "bundles")) {
		orphans = append(orphans, fmt.Sprintf("%s: %s", b, strings.Join(leftovers(b), ", ")))
	}
	if len(orphans) > 0 {
		t.Errorf("after SIGTERM, with no sandbox listed, nook serve left %d sandboxes running (its warm pool?) that are only cleaned up by the next start:\n  %s",
			len(orphans), strings.Join(orphans, "\n  "))
	}
	restarted = true
	if err := srv.Start(); err != nil {
		t.Fatalf("restart nook serve: %v", err)
	}
	// The next start removes them.
	settledSnapshot(t)
	for _, o := range orphans {
		b, _, _ := strings.Cut(o, ":")
		requireNoLeftovers(t, b)
	}
}
