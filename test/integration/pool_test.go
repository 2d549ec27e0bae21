package integration

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

// waitWarm waits (bounded) until the base template's pool holds a sandbox.
func waitWarm(t *testing.T) {
	t.Helper()
	for i := 0; i < 600; i++ {
		var sizes map[string]int
		if r := api(t, "GET", "/v1/pool", nil); r.Status == 200 && json.Unmarshal(r.Body, &sizes) == nil && sizes["base"] > 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("the base template's warm pool never filled")
}

// pooled reports whether the serve log says id came from the warm pool.
func pooled(t *testing.T, id string) bool {
	t.Helper()
	data, err := os.ReadFile(srv.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.Contains(line, `msg="sandbox created"`) && strings.Contains(line, "id="+id) {
			return strings.Contains(line, "pooled=true")
		}
	}
	t.Fatalf("no creation of %s in the serve log", id)
	return false
}

// A sandbox claimed from the warm pool must be indistinguishable from a
// cold one: its own hostname, the create's env (and only the envd layers),
// a fresh writable layer, its own access token; and it is listed while the
// warm ones are not.
func TestPooledSandboxIsLikeACold(t *testing.T) {
	waitWarm(t)
	before := listSandboxIDs(t)
	r := api(t, "POST", "/sandboxes", []byte(`{"templateID":"base","timeout":600,"envVars":{"CLAIM_ENV":"from-create"},"metadata":{"pool":"test"}}`))
	if r.Status != 201 {
		t.Fatalf("create: %s", r)
	}
	var sb struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.Unmarshal(r.Body, &sb); err != nil {
		t.Fatal(err)
	}
	id := sb.SandboxID
	t.Cleanup(func() { killQuiet(id) })
	if !pooled(t, id) {
		t.Fatalf("sandbox %s was not taken from the warm pool; this test needs a pooled one", id)
	}
	if got := len(listSandboxIDs(t)); got != len(before)+1 {
		t.Errorf("listing grew by %d sandboxes, want 1 (warm ones must stay invisible)", got-len(before))
	}
	if h := strings.TrimSpace(mustRun(t, id, "user", "hostname")); h != id {
		t.Errorf("hostname %q, want the sandbox id %q", h, id)
	}
	env := mustRun(t, id, "user", "env | sort")
	if !strings.Contains(env, "CLAIM_ENV=from-create\n") {
		t.Errorf("the create's env is missing in a pooled sandbox:\n%s", env)
	}
	for _, line := range strings.Split(strings.TrimSpace(env), "\n") {
		name, _, _ := strings.Cut(line, "=")
		switch name {
		case "CLAIM_ENV", "HOME", "USER", "LOGNAME", "PATH", "PWD", "SHLVL", "_":
		default:
			t.Errorf("unexpected variable %q in commands.run of a pooled sandbox", line)
		}
	}
	if out := mustRun(t, id, "root", "find /tmp /home/user -newer /etc/hostname -mindepth 1 2>/dev/null | head; ls -A /tmp"); strings.TrimSpace(out) != "" {
		t.Errorf("a pooled sandbox holds files from before its claim:\n%s", out)
	}
	// The pool's warm-up command (bash -l -c true) has ended: only PID 1
	// and this command run.
	for _, line := range strings.Split(strings.TrimSpace(mustRun(t, id, "root", "ps -e -o comm=")), "\n") {
		switch strings.TrimSpace(line) {
		case "nook-agent", "bash", "ps":
		default:
			t.Errorf("a pooled sandbox runs %q from before its claim", line)
		}
	}
	// Its token is its own: another sandbox's token is refused.
	other := createSandbox(t)
	resp := do(t, "GET", proxyURL+"/envs", nil, map[string]string{
		"E2b-Sandbox-Id": id, "X-Access-Token": sandboxToken(t, other)})
	if resp.Status != 401 {
		t.Errorf("another sandbox's token reached %s's agent: %s", id, resp)
	}
	resp = do(t, "GET", proxyURL+"/envs", nil, map[string]string{
		"E2b-Sandbox-Id": id, "X-Access-Token": sandboxToken(t, id)})
	if resp.Status != 200 || !strings.Contains(string(resp.Body), `"CLAIM_ENV":"from-create"`) {
		t.Errorf("GET /envs with its own token: %s", resp)
	}
}
