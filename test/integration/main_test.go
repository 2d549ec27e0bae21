// Package integration holds nook's root integration tests: they build nook and
// nook-agent, start a real `nook serve` on test ports with the data dir
// /var/lib/nook-test (shared with the e2e suite, which never runs at the same
// time, so the base template is built once) and attack it from the outside
// (REST API, proxy) and from the inside (commands run in sandboxes).
//
// They need root and the host packages nook needs (runc, mmdebstrap).
//
//	cd /work/main && go test -count=1 -v ./test/integration/
//
// NOOK_TEST_DATA overrides the data dir (e.g. while another suite uses the
// default one); NOOK_TEST_SERVE_FLAGS adds flags to nook serve.
package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
	apiAddr   = "127.0.0.1:14000"
	proxyAddr = "127.0.0.1:14002"
	apiURL    = "http://" + apiAddr
	proxyURL  = "http://" + proxyAddr
	apiKey    = "nook-integration-test-key"
	// healthTimeout bounds the wait for nook serve to answer.
	healthTimeout = 10 * time.Minute
)

var (
	nookBin  string
	agentBin string
	dataDir  = "/var/lib/nook-test"
	srv      *testenv.Server
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "FAIL: nook's integration tests need root (they mount file systems and run runc through nook serve); run them as root")
		return 1
	}
	if d := os.Getenv("NOOK_TEST_DATA"); d != "" {
		dataDir = d
	}
	repoRoot, err := testenv.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	binDir, err := os.MkdirTemp("", "nook-integration-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	defer os.RemoveAll(binDir)
	// nook serve expects its other in-sandbox binaries beside nook-agent.
	bins, err := testenv.Build(repoRoot, binDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	nookBin, agentBin = bins.Nook, bins.Agent
	// Like `make test`: built-in templates' root filesystems are shared
	// between the test suites' data dirs, so each is built once.
	if os.Getenv("NOOK_ROOTFS_CACHE") == "" {
		os.Setenv("NOOK_ROOTFS_CACHE", testenv.RootfsCache)
	}
	srv = &testenv.Server{
		Bin: nookBin, DataDir: dataDir, APIAddr: apiAddr, ProxyAddr: proxyAddr,
		APIKey: apiKey, AgentPath: agentBin,
		// NOOK_TEST_SERVE_FLAGS adds flags (e.g. "--network=false").
		Flags:   strings.Fields(os.Getenv("NOOK_TEST_SERVE_FLAGS")),
		LogPath: filepath.Join(binDir, "serve.log"),
		// The first start builds the base template, about a minute.
		Timeout: healthTimeout,
	}
	if err := srv.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: start nook serve:", err)
		fmt.Fprintln(os.Stderr, srv.LogTail(60))
		srv.Stop()
		return 1
	}
	code := m.Run()
	// Sandboxes outlive nook serve by design; kill whatever a failed test
	// left so that nothing leaks into the next suite.
	if left := killAllSandboxes(); left != nil {
		fmt.Fprintln(os.Stderr, "cleanup after tests:", left)
		code = 1
	}
	if code != 0 {
		fmt.Fprintln(os.Stderr, "--- nook serve log (tail) ---")
		fmt.Fprintln(os.Stderr, srv.LogTail(80))
	}
	srv.Stop()
	// Leave the shared data dir with nothing running: a stopped nook serve
	// may leave its warm pool behind (see TestGracefulStopLeavesNoOrphans);
	// a start without a pool removes it.
	if len(dirEntriesQuiet(filepath.Join(dataDir, "bundles"))) > 0 {
		if help, _ := exec.Command(nookBin, "serve", "--help").CombinedOutput(); bytes.Contains(help, []byte("--pool-size")) {
			if err := srv.Start("--pool-size=0"); err != nil {
				fmt.Fprintln(os.Stderr, "final cleanup start:", err)
			}
			srv.Stop()
		}
	}
	return code
}

func dirEntriesQuiet(dir string) []string {
	es, _ := os.ReadDir(dir)
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

// ---- REST API helpers ----

var httpClient = &http.Client{
	Timeout: 60 * time.Second,
	// Report redirects as they are: tests check status codes.
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// response is a finished HTTP exchange.
type response struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r response) String() string {
	b := r.Body
	if len(b) > 300 {
		b = b[:300]
	}
	return fmt.Sprintf("HTTP %d %s", r.Status, b)
}

// do sends a request with raw net/http. body may be nil; hdr adds headers
// (an empty value deletes it, e.g. to drop the API key).
func do(t testing.TB, method, url string, body []byte, hdr map[string]string) response {
	t.Helper()
	r, err := doErr(method, url, body, hdr)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return r
}

func doErr(method, url string, body []byte, hdr map[string]string) (response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return response{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if strings.HasPrefix(url, apiURL) {
		req.Header.Set("X-API-Key", apiKey)
	}
	for k, v := range hdr {
		if strings.EqualFold(k, "Host") {
			req.Host = v
			continue
		}
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, err
	}
	return response{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

// api sends a request to the REST API with the test's API key.
func api(t testing.TB, method, path string, body []byte) response {
	t.Helper()
	return do(t, method, apiURL+path, body, nil)
}

// createSandbox creates a sandbox of the base template through the REST API
// and kills it when the test ends.
func createSandbox(t testing.TB) string {
	t.Helper()
	id, err := tryCreate()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { killQuiet(id) })
	return id
}

func tryCreate() (string, error) {
	r, err := doErr("POST", apiURL+"/sandboxes", []byte(`{"templateID":"base","timeout":600}`), nil)
	if err != nil {
		return "", fmt.Errorf("create sandbox: %w", err)
	}
	if r.Status != http.StatusCreated {
		return "", fmt.Errorf("create sandbox: %s", r)
	}
	var sb struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if err := json.Unmarshal(r.Body, &sb); err != nil || sb.SandboxID == "" {
		return "", fmt.Errorf("create sandbox: bad answer %s (%v)", r, err)
	}
	return sb.SandboxID, nil
}

// sandboxToken returns a running sandbox's envd access token.
func sandboxToken(t testing.TB, id string) string {
	t.Helper()
	r := api(t, "GET", "/sandboxes/"+id, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("GET /sandboxes/%s: %s", id, r)
	}
	var d struct {
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if err := json.Unmarshal(r.Body, &d); err != nil || d.EnvdAccessToken == "" {
		t.Fatalf("GET /sandboxes/%s: no access token in %s", id, r)
	}
	return d.EnvdAccessToken
}

// killSandbox kills a sandbox through the REST API and requires 204.
func killSandbox(t testing.TB, id string) {
	t.Helper()
	r := api(t, "DELETE", "/sandboxes/"+id, nil)
	if r.Status != http.StatusNoContent {
		t.Fatalf("DELETE /sandboxes/%s: %s", id, r)
	}
}

// killQuiet kills a sandbox if it still exists (test cleanup).
func killQuiet(id string) {
	doErr("DELETE", apiURL+"/sandboxes/"+id, nil, nil)
}

// listSandboxIDs returns the ids of GET /sandboxes.
func listSandboxIDs(t testing.TB) []string {
	t.Helper()
	r := api(t, "GET", "/sandboxes", nil)
	if r.Status != http.StatusOK {
		t.Fatalf("GET /sandboxes: %s", r)
	}
	var list []struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.Unmarshal(r.Body, &list); err != nil {
		t.Fatalf("GET /sandboxes: %v in %s", err, r)
	}
	ids := make([]string, 0, len(list))
	for _, s := range list {
		ids = append(ids, s.SandboxID)
	}
	return ids
}

// killAllSandboxes kills every sandbox the server lists.
func killAllSandboxes() error {
	r, err := doErr("GET", apiURL+"/sandboxes", nil, nil)
	if err != nil {
		return err
	}
	var list []struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.Unmarshal(r.Body, &list); err != nil {
		return fmt.Errorf("GET /sandboxes: %v", err)
	}
	var errs []error
	for _, s := range list {
		if r, err := doErr("DELETE", apiURL+"/sandboxes/"+s.SandboxID, nil, nil); err != nil {
			errs = append(errs, err)
		} else if r.Status != http.StatusNoContent && r.Status != http.StatusNotFound {
			errs = append(errs, fmt.Errorf("kill %s: %s", s.SandboxID, r))
		}
	}
	return errors.Join(errs...)
}

// ---- running commands through the CLI ----

// result is a finished `nook sandbox run`.
type result struct {
	Stdout, Stderr string
	Code           int // the command's exit code as nook passes it through; -1: the CLI did not exit
}

func (r result) String() string {
	return fmt.Sprintf("exit %d, stdout %q, stderr %q", r.Code, clip(r.Stdout), clip(r.Stderr))
}

func clip(s string) string {
	if len(s) > 2000 {
		return s[:2000] + "..."
	}
	return s
}

// cliArgs are the client flags every nook sandbox verb gets.
func cliArgs(verb string) []string {
	return []string{"sandbox", "--api-url", apiURL, "--api-key", apiKey, "--sandbox-url", proxyURL, verb}
}

// runAs runs cmd in the sandbox with `nook sandbox run -u user` (user ""
// is the sandbox's default user), bounded by limit.
func runAs(t testing.TB, id, user, cmd string, limit time.Duration) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	args := cliArgs("run")
	if user != "" {
		args = append(args, "-u", user)
	}
	args = append(args, id, "--", cmd)
	c := exec.CommandContext(ctx, nookBin, args...)
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	err := c.Run()
	r := result{Stdout: stdout.String(), Stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit) && exit.ExitCode() >= 0:
		r.Code = exit.ExitCode()
	default:
		r.Code = -1
		r.Stderr += fmt.Sprintf("\n[nook sandbox run: %v]", err)
	}
	return r
}

// root runs cmd as root in the sandbox and bounds it to a minute.
func root(t testing.TB, id, cmd string) result {
	t.Helper()
	return runAs(t, id, "root", cmd, time.Minute)
}

// mustRun runs cmd (as user) and requires exit 0; it returns stdout.
func mustRun(t testing.TB, id, user, cmd string) string {
	t.Helper()
	r := runAs(t, id, user, cmd, time.Minute)
	if r.Code != 0 {
		t.Fatalf("sandbox %s: %q as %q: %s", id, cmd, user, r)
	}
	return r.Stdout
}

// ---- host-side inspection ----

// leftovers lists every host resource still held for sandbox id: mounts,
// cgroups, processes, directories, runc state.
func leftovers(id string) []string {
	var out []string
	bundle := filepath.Join(dataDir, "bundles", id)
	run := filepath.Join(dataDir, "run", id)
	// Mounts (in the host's mount namespace).
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 5 {
				continue
			}
			mp := fields[4]
			if strings.HasPrefix(mp, dataDir+"/") && strings.Contains(mp, id) {
				out = append(out, "mount "+mp)
			}
		}
		f.Close()
	}
	// Cgroups: v1 controllers and the unified hierarchy are directories
	// under /sys/fs/cgroup; a pure v2 host has /sys/fs/cgroup/nook/ID.
	cgs, _ := filepath.Glob("/sys/fs/cgroup/*/nook/" + id)
	if st, err := os.Stat("/sys/fs/cgroup/nook/" + id); err == nil && st.IsDir() {
		cgs = append(cgs, "/sys/fs/cgroup/nook/"+id)
	}
	for _, cg := range cgs {
		out = append(out, "cgroup "+cg)
	}
	// Processes whose root or cwd is in the bundle, or whose cgroup is the
	// sandbox's. Zombies are skipped: a killed sandbox's PID 1 is reparented
	// to the host's init, which reaps it when it gets to it; a zombie holds
	// no resource (its cgroup shows as deleted).
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		if st, err := os.ReadFile(filepath.Join(p, "stat")); err == nil {
			if i := bytes.LastIndexByte(st, ')'); i > 0 && i+2 < len(st) && (st[i+2] == 'Z' || st[i+2] == 'X') {
				continue
			}
		}
		for _, link := range []string{"root", "cwd"} {
			if target, err := os.Readlink(filepath.Join(p, link)); err == nil && (target == bundle || strings.HasPrefix(target, bundle+"/")) {
				out = append(out, fmt.Sprintf("process %s (%s %s)", filepath.Base(p), link, target))
			}
		}
		if cg, err := os.ReadFile(filepath.Join(p, "cgroup")); err == nil && strings.Contains(string(cg), "/nook/"+id) {
			out = append(out, fmt.Sprintf("process %s in cgroup of %s", filepath.Base(p), id))
		}
	}
	// Network: its veth into nook's bridge (named after the id's tail).
	veth := id
	if len(veth) > 12 {
		veth = veth[len(veth)-12:]
	}
	if _, err := os.Lstat("/sys/class/net/nk" + veth); err == nil {
		out = append(out, "network interface nk"+veth)
	}
	// Directories and files.
	netState, _ := filepath.Glob(filepath.Join(dataDir, "network", "sandboxes", id+"*"))
	for _, d := range append([]string{bundle, run, filepath.Join(dataDir, "runc", id), filepath.Join(dataDir, "network", "netns", id)}, netState...) {
		if _, err := os.Lstat(d); err == nil {
			out = append(out, "path "+d)
		}
	}
	// runc's own view.
	if b, err := exec.Command("runc", "--root", filepath.Join(dataDir, "runc"), "list", "-q").CombinedOutput(); err == nil {
		for _, l := range strings.Fields(string(b)) {
			if l == id {
				out = append(out, "runc container "+id)
			}
		}
	} else {
		out = append(out, fmt.Sprintf("runc list: %v: %s", err, b))
	}
	return out
}

// requireNoLeftovers fails the test if anything of sandbox id is left.
func requireNoLeftovers(t testing.TB, id string) {
	t.Helper()
	if l := leftovers(id); len(l) > 0 {
		t.Errorf("sandbox %s was killed but left behind:\n  %s", id, strings.Join(l, "\n  "))
	}
}

// cgroupRead reads file of sandbox id's cgroup: the v1 controller's
// hierarchy first, then a v2 one (pure or the hybrid "unified" mount).
func cgroupRead(id, controller, file string) (string, bool) {
	for _, dir := range []string{
		filepath.Join("/sys/fs/cgroup", controller, "nook", id),
		filepath.Join("/sys/fs/cgroup", "nook", id),
		filepath.Join("/sys/fs/cgroup", "unified", "nook", id),
	} {
		if b, err := os.ReadFile(filepath.Join(dir, file)); err == nil {
			return strings.TrimSpace(string(b)), true
		}
	}
	return "", false
}

// keyedValue returns the value of key in a "key value" per line file.
func keyedValue(content, key string) (int64, bool) {
	for _, l := range strings.Split(content, "\n") {
		f := strings.Fields(l)
		if len(f) == 2 && f[0] == key {
			var v int64
			if _, err := fmt.Sscan(f[1], &v); err == nil {
				return v, true
			}
		}
	}
	return 0, false
}

// oomKills returns how many processes the memory cgroup of id has
// OOM-killed (v1 memory.oom_control, v2 memory.events).
func oomKills(t testing.TB, id string) int64 {
	t.Helper()
	for _, file := range []string{"memory.oom_control", "memory.events"} {
		if c, ok := cgroupRead(id, "memory", file); ok {
			if v, ok := keyedValue(c, "oom_kill"); ok {
				return v
			}
		}
	}
	t.Fatalf("sandbox %s: no oom_kill counter in its memory cgroup", id)
	return 0
}

// pidsMaxHits returns how often id's pids cgroup refused a fork.
func pidsMaxHits(t testing.TB, id string) int64 {
	t.Helper()
	c, ok := cgroupRead(id, "pids", "pids.events")
	if !ok {
		t.Fatalf("sandbox %s: no pids.events in its pids cgroup", id)
	}
	v, _ := keyedValue(c, "max")
	return v
}

// sandboxPid returns the host pid of sandbox id's PID 1 (runc state).
func sandboxPid(t testing.TB, id string) int {
	t.Helper()
	out, err := exec.Command("runc", "--root", filepath.Join(dataDir, "runc"), "state", id).Output()
	if err != nil {
		t.Fatalf("runc state %s: %v", id, err)
	}
	var st struct {
		Pid    int    `json:"pid"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil || st.Pid <= 0 {
		t.Fatalf("runc state %s: %s (%v)", id, out, err)
	}
	return st.Pid
}

// dirEntries returns the names in dir (none if it does not exist).
func dirEntries(t testing.TB, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

// attempt runs cmd in the sandbox as user inside a wrapper that always
// exits 0 and reports whether cmd succeeded, so that an infrastructure
// failure (the CLI or agent failing) is never mistaken for a denied
// attempt. It returns whether cmd succeeded and everything it printed.
func attempt(t testing.TB, id, user, cmd string) (bool, string) {
	t.Helper()
	wrapped := fmt.Sprintf("if ( %s ) </dev/null 2>&1; then echo @@ATTEMPT-SUCCEEDED; else echo @@ATTEMPT-FAILED $?; fi", cmd)
	r := runAs(t, id, user, wrapped, time.Minute)
	out := r.Stdout
	switch {
	case r.Code == 0 && strings.Contains(out, "@@ATTEMPT-SUCCEEDED"):
		return true, strings.TrimSpace(strings.ReplaceAll(out, "@@ATTEMPT-SUCCEEDED", ""))
	case r.Code == 0 && strings.Contains(out, "@@ATTEMPT-FAILED"):
		return false, strings.TrimSpace(out)
	}
	t.Fatalf("sandbox %s: could not run the attempt %q as %q: %s", id, cmd, user, r)
	return false, ""
}

// mustFail requires that cmd, run in the sandbox as user, fails.
func mustFail(t testing.TB, id, user, what, cmd string) {
	t.Helper()
	if ok, out := attempt(t, id, user, cmd); ok {
		t.Errorf("SECURITY: %s: %q as %q succeeded inside sandbox %s; output: %s", what, cmd, user, id, clip(out))
	}
}
