// Package pause tests pause/resume, snapshots, clones, rollback and backups
// against a real `nook serve` (data dir /var/lib/nook-test-pause, ports
// 127.0.0.1:18000/18002). They need root, runc, and runsc for the memory
// mode test (skipped without it).
//
//	cd /work/main && go test -count=1 -v ./test/pause/
package pause

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nookhq/nook/test/testenv"
)

const (
	apiAddr   = "127.0.0.1:18000"
	proxyAddr = "127.0.0.1:18002"
	apiURL    = "http://" + apiAddr
	proxyURL  = "http://" + proxyAddr
	apiKey    = "nook-pause-test-key"
	dataDir   = "/var/lib/nook-test-pause"
)

var (
	nookBin string
	srv     *testenv.Server
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "FAIL: the pause tests need root")
		return 1
	}
	repoRoot, err := testenv.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	binDir, err := os.MkdirTemp("", "nook-pause-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	defer os.RemoveAll(binDir)
	// gVisor's gofer opens the bind-mounted agent from inside the sandbox's
	// user namespace: its directory must be traversable.
	os.Chmod(binDir, 0o755)
	bins, err := testenv.Build(repoRoot, binDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	nookBin = bins.Nook
	stopS3 := startFakeS3() // s3_test.go
	defer stopS3()
	flags := []string{"--pool-size", "0"}
	// Pause, snapshots and backups do not need sandbox networking; run
	// loopback-only sandboxes when this nook has the switch
	// (NOOK_PAUSE_TEST_NETWORK=1 keeps it on).
	if help, _ := exec.Command(nookBin, "serve", "--help").CombinedOutput(); bytes.Contains(help, []byte("--network ")) && os.Getenv("NOOK_PAUSE_TEST_NETWORK") != "1" {
		flags = append(flags, "--network=false")
	}
	srv = &testenv.Server{
		Bin: nookBin, DataDir: dataDir, APIAddr: apiAddr, ProxyAddr: proxyAddr,
		APIKey: apiKey, AgentPath: bins.Agent,
		Flags:   append(flags, s3Args()...),
		Env:     append(s3Env(), testenv.RootfsCacheEnv()...),
		LogPath: filepath.Join(binDir, "serve.log"),
	}
	if err := srv.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: start nook serve:", err)
		fmt.Fprintln(os.Stderr, srv.LogTail(60))
		srv.Stop()
		return 1
	}
	code := m.Run()
	killAll()
	if code != 0 {
		fmt.Fprintln(os.Stderr, "--- nook serve log (tail) ---")
		fmt.Fprintln(os.Stderr, srv.LogTail(80))
	}
	srv.Stop()
	return code
}

type response struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r response) String() string { return fmt.Sprintf("HTTP %d %s", r.Status, r.Body) }

var httpClient = &http.Client{Timeout: 120 * time.Second}

func doErr(method, url string, body any, hdr map[string]string) (response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return response{}, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return response{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("X-API-Key", apiKey)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return response{Status: resp.StatusCode, Header: resp.Header, Body: b}, err
}

func api(t testing.TB, method, path string, body any) response {
	t.Helper()
	r, err := doErr(method, apiURL+path, body, nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

func want(t testing.TB, r response, status int, what string) {
	t.Helper()
	if r.Status != status {
		t.Fatalf("%s: want HTTP %d, got %s", what, status, r)
	}
}

func decodeBody[T any](t testing.TB, r response) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(r.Body, &v); err != nil {
		t.Fatalf("decode %s: %v", r, err)
	}
	return v
}

// create makes a sandbox from body (templateID defaults to base) and
// kills it when the test ends.
func create(t testing.TB, body map[string]any) string {
	t.Helper()
	if body == nil {
		body = map[string]any{}
	}
	if body["templateID"] == nil {
		body["templateID"] = "base"
	}
	if body["timeout"] == nil {
		body["timeout"] = 600
	}
	r := api(t, "POST", "/v2/sandboxes", body)
	want(t, r, http.StatusCreated, "create sandbox")
	id := decodeBody[struct {
		SandboxID string `json:"sandboxID"`
	}](t, r).SandboxID
	t.Cleanup(func() { doErr("DELETE", apiURL+"/sandboxes/"+id, nil, nil) })
	return id
}

type detail struct {
	SandboxID  string `json:"sandboxID"`
	TemplateID string `json:"templateID"`
	State      string `json:"state"`
	PauseMode  string `json:"pauseMode"`
	PauseNote  string `json:"pauseNote"`
	Lifecycle  struct {
		AutoResume bool   `json:"autoResume"`
		OnTimeout  string `json:"onTimeout"`
	} `json:"lifecycle"`
}

func info(t testing.TB, id string) detail {
	t.Helper()
	r := api(t, "GET", "/sandboxes/"+id, nil)
	want(t, r, http.StatusOK, "GET sandbox "+id)
	return decodeBody[detail](t, r)
}

func pause(t testing.TB, id string, memory *bool) time.Duration {
	t.Helper()
	body := map[string]any{}
	if memory != nil {
		body["memory"] = *memory
	}
	start := time.Now()
	r := api(t, "POST", "/sandboxes/"+id+"/pause", body)
	want(t, r, http.StatusNoContent, "pause "+id)
	return time.Since(start)
}

// connect resumes (201) or extends (200) a sandbox and returns the status.
func connect(t testing.TB, id string) (int, time.Duration) {
	t.Helper()
	start := time.Now()
	r := api(t, "POST", "/v2/sandboxes/"+id+"/connect", map[string]any{"timeout": 600})
	if r.Status != http.StatusOK && r.Status != http.StatusCreated {
		t.Fatalf("connect %s: %s", id, r)
	}
	return r.Status, time.Since(start)
}

func killAll() {
	r, err := doErr("GET", apiURL+"/sandboxes", nil, nil)
	if err != nil {
		return
	}
	var list []struct {
		SandboxID string `json:"sandboxID"`
	}
	json.Unmarshal(r.Body, &list)
	for _, s := range list {
		doErr("DELETE", apiURL+"/sandboxes/"+s.SandboxID, nil, nil)
	}
}

// run runs cmd as root in the sandbox (nook sandbox run) and returns its
// stdout; it fails the test unless cmd exits 0.
func run(t testing.TB, id, cmd string) string {
	t.Helper()
	out, err := tryRun(id, cmd)
	if err != nil {
		t.Fatalf("sandbox %s: %q: %v", id, cmd, err)
	}
	return out
}

func tryRun(id, cmd string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, nookBin, "sandbox", "--api-url", apiURL, "--api-key", apiKey, "--sandbox-url", proxyURL,
		"run", "-u", "root", id, "--", cmd)
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%v: stdout %q stderr %q", err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// cli runs a nook client verb and returns its stdout.
func cli(t testing.TB, args ...string) string {
	t.Helper()
	var full []string
	if args[0] == "sandbox" {
		full = append([]string{"sandbox", "--api-url", apiURL, "--api-key", apiKey, "--sandbox-url", proxyURL}, args[1:]...)
	} else {
		full = append([]string{args[0], "--api-url", apiURL, "--api-key", apiKey}, args[1:]...)
	}
	c := exec.Command(nookBin, full...)
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		t.Fatalf("nook %s: %v: %s %s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// memCgroup returns the sandbox's memory cgroup dir on the host (v1 or v2).
func memCgroup(id string) string {
	for _, d := range []string{"/sys/fs/cgroup/memory/nook/" + id, "/sys/fs/cgroup/nook/" + id} {
		if _, err := os.Stat(d); err == nil {
			return d
		}
	}
	return ""
}

// mountsOf lists the host mounts under the data dir that belong to id.
func mountsOf(id string) []string {
	data, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && strings.HasPrefix(f[4], dataDir+"/") && strings.Contains(f[4], id) {
			out = append(out, f[4])
		}
	}
	return out
}

func listIDs(t testing.TB, state string) []string {
	t.Helper()
	r := api(t, "GET", "/v2/sandboxes?state="+state, nil)
	want(t, r, http.StatusOK, "list")
	var list []struct {
		SandboxID string `json:"sandboxID"`
	}
	json.Unmarshal(r.Body, &list)
	var ids []string
	for _, s := range list {
		ids = append(ids, s.SandboxID)
	}
	return ids
}

func has(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func waitState(t testing.TB, id, state string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if info(t, id).State == state {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("sandbox %s did not become %s within %s (is %s)", id, state, limit, info(t, id).State)
}
