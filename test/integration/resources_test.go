package integration

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// requireServing checks that the API and the proxy answer and nook serve
// is still the process the tests started.
func requireServing(t testing.TB, during string) {
	t.Helper()
	if pid := srv.PID(); pid == 0 {
		t.Fatalf("%s: nook serve is not running", during)
	} else if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
		t.Fatalf("%s: nook serve (pid %d) is gone", during, pid)
	}
	if r, err := doErr("GET", apiURL+"/health", nil, nil); err != nil || r.Status != http.StatusNoContent {
		t.Errorf("%s: API /health: %v %v", during, r, err)
	}
	if r, err := doErr("GET", apiURL+"/sandboxes", nil, nil); err != nil || r.Status != http.StatusOK {
		t.Errorf("%s: GET /sandboxes: %v %v", during, r, err)
	}
}

// TestMemoryHogIsOOMKilled: a process allocating more than the template's
// 2000 MB is killed by the sandbox's memory cgroup; the sandbox, another
// sandbox, and nook keep answering.
func TestMemoryHogIsOOMKilled(t *testing.T) {
	a := createSandbox(t)
	b := createSandbox(t)
	before := oomKills(t, a)
	r := runAs(t, a, "user", `python3 -c "a = bytearray(3*1024**3); print('allocated', len(a))"`, 3*time.Minute)
	if r.Code == 0 || r.Code == -1 || strings.Contains(r.Stdout, "allocated") {
		t.Errorf("SECURITY: a 3 GiB allocation in sandbox %s (limit 2000 MB) was not killed: %s", a, r)
	}
	if after := oomKills(t, a); after <= before {
		t.Errorf("sandbox %s: the memory cgroup's oom_kill count stayed at %d (the hog was not OOM-killed by the sandbox's limit): %s", a, after, r)
	}
	if got := strings.TrimSpace(mustRun(t, a, "user", "echo still-here")); got != "still-here" {
		t.Errorf("sandbox %s after the OOM kill: %q", a, got)
	}
	if got := strings.TrimSpace(mustRun(t, b, "user", "echo neighbour-ok")); got != "neighbour-ok" {
		t.Errorf("sandbox %s after %s's OOM kill: %q", b, a, got)
	}
	requireServing(t, "after the OOM kill")
}

// TestForkBombHitsPidsLimit: a fork bomb in one sandbox is held at the pids
// limit; another sandbox and nook keep answering; once the bomb is killed
// the sandbox runs commands again; killing it leaves nothing behind.
func TestForkBombHitsPidsLimit(t *testing.T) {
	a := createSandbox(t)
	b := createSandbox(t)
	if v, ok := cgroupRead(a, "pids", "pids.max"); !ok || v != "1024" {
		t.Fatalf("sandbox %s: pids.max %q (found %v), want 1024", a, v, ok)
	}
	before := pidsMaxHits(t, a)
	// The agent's own tasks (it keeps a few threads warm): the count the
	// sandbox must come back to once the bomb is gone.
	baseline := 0
	if v, ok := cgroupRead(a, "pids", "pids.current"); ok {
		fmt.Sscan(v, &baseline)
	}

	// The bomb's command waits for a sleep it started first, so it never
	// ends on its own, and every bomb process stays in its process group,
	// which the agent's SendSignal kills (without forking anything).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const bombMarker = "sleep 100000"
	args := append(cliArgs("run"), a, "--", `exec >/dev/null 2>&1; `+bombMarker+` & :(){ :|:& };:; wait`)
	bomb := exec.CommandContext(ctx, nookBin, args...)
	var bombOut bytes.Buffer
	bomb.Stdout, bomb.Stderr = &bombOut, &bombOut
	if err := bomb.Start(); err != nil {
		t.Fatal(err)
	}
	bombDone := make(chan error, 1)
	go func() { bombDone <- bomb.Wait() }()

	hit := false
	for i := 0; i < 600 && !hit; i++ {
		select {
		case err := <-bombDone:
			t.Fatalf("the fork bomb's run ended early (%v): %s", err, bombOut.String())
		default:
		}
		hit = pidsMaxHits(t, a) > before
		if !hit {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if !hit {
		t.Fatalf("sandbox %s: the fork bomb never hit the pids limit (pids.current %v)", a, func() string { v, _ := cgroupRead(a, "pids", "pids.current"); return v }())
	}
	if v, ok := cgroupRead(a, "pids", "pids.current"); ok {
		var n int
		fmt.Sscan(v, &n)
		if n > 1024 {
			t.Errorf("SECURITY: sandbox %s runs %d tasks, above its pids limit 1024", a, n)
		}
	}
	// While the bomb runs: the neighbour and nook answer.
	if got := strings.TrimSpace(mustRun(t, b, "user", "echo neighbour-ok")); got != "neighbour-ok" {
		t.Errorf("sandbox %s during %s's fork bomb: %q", b, a, got)
	}
	requireServing(t, "during the fork bomb")
	if r := api(t, "GET", "/sandboxes/"+a, nil); r.Status != http.StatusOK {
		t.Errorf("GET /sandboxes/%s during its fork bomb: %s", a, r)
	}
	if pidsMaxHits(t, a) <= before {
		t.Errorf("sandbox %s: pids.events stopped counting", a)
	}

	// Stop the bomb: SendSignal SIGKILL to its command through envd (the
	// agent signals the command's process group).
	token := sandboxToken(t, a)
	pid := findEnvdProcess(t, a, token, bombMarker)
	if pid == 0 {
		t.Fatalf("sandbox %s: envd does not list the bomb's command", a)
	}
	if r := envdCall(t, a, token, "SendSignal", fmt.Sprintf(`{"process":{"pid":%d},"signal":"SIGNAL_SIGKILL"}`, pid)); r.Status != http.StatusOK {
		t.Fatalf("SendSignal SIGKILL to the bomb (pid %d): %s", pid, r)
	}
	select {
	case <-bombDone:
	case <-time.After(2 * time.Minute):
		cancel()
		<-bombDone
		t.Errorf("the bomb's run did not end after SIGKILL to its process group")
	}

	alive := false
	for i := 0; i < 10 && !alive; i++ {
		r := runAs(t, a, "user", "echo alive", 30*time.Second)
		alive = r.Code == 0 && strings.TrimSpace(r.Stdout) == "alive"
		if !alive {
			t.Logf("sandbox %s after the bomb, try %d: %s", a, i+1, r)
			time.Sleep(time.Second)
		}
	}
	if !alive {
		leftover, _ := cgroupRead(a, "pids", "pids.current")
		t.Errorf("sandbox %s does not run commands after its fork bomb's request ended (pids.current %s)", a, leftover)
	}
	// Killed bomb processes count until the agent (PID 1) has reaped them:
	// wait (bounded) for the count to drop.
	tasks := -1
	for i := 0; i < 150; i++ {
		v, ok := cgroupRead(a, "pids", "pids.current")
		if !ok {
			break
		}
		fmt.Sscan(v, &tasks)
		if tasks <= baseline+10 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if tasks > baseline+10 {
		ps := runAs(t, a, "root", "ps -eo pid,ppid,pgid,stat,args | head -20", 30*time.Second)
		t.Errorf("sandbox %s still has %d tasks (%d before the bomb) after the fork bomb's request ended (the agent did not kill its process group?): %s", a, tasks, baseline, ps)
	}
	killSandbox(t, a)
	requireNoLeftovers(t, a)
	if got := strings.TrimSpace(mustRun(t, b, "user", "echo neighbour-ok")); got != "neighbour-ok" {
		t.Errorf("sandbox %s after %s was killed: %q", b, a, got)
	}
}

// envdCall makes a unary Connect (JSON) call to sandbox id's envd process
// service through the proxy, as the root user.
func envdCall(t testing.TB, id, token, method, body string) response {
	t.Helper()
	return do(t, "POST", proxyURL+"/process.Process/"+method, []byte(body), map[string]string{
		"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": envdPort, "X-Access-Token": token,
		"Connect-Protocol-Version": "1",
		"Authorization":            "Basic " + base64.StdEncoding.EncodeToString([]byte("root:")),
	})
}

// findEnvdProcess returns the pid of the envd process of sandbox id whose
// command line contains marker (0 if none).
func findEnvdProcess(t testing.TB, id, token, marker string) uint32 {
	t.Helper()
	r := envdCall(t, id, token, "List", `{}`)
	if r.Status != http.StatusOK {
		t.Fatalf("envd List in %s: %s", id, r)
	}
	var list struct {
		Processes []struct {
			Pid    uint32 `json:"pid"`
			Config struct {
				Cmd  string   `json:"cmd"`
				Args []string `json:"args"`
			} `json:"config"`
		} `json:"processes"`
	}
	if err := json.Unmarshal(r.Body, &list); err != nil {
		t.Fatalf("envd List in %s: %v: %s", id, err, r)
	}
	for _, p := range list.Processes {
		if strings.Contains(p.Config.Cmd+" "+strings.Join(p.Config.Args, " "), marker) {
			return p.Pid
		}
	}
	return 0
}
