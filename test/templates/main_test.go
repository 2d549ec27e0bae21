// Package templates holds the root integration tests of templates from OCI
// images and Dockerfiles: they build nook and nook-agent, start a real
// `nook serve` (data dir /var/lib/nook-test-tpl, API 127.0.0.1:15000, proxy
// 127.0.0.1:15002), build images in-process with go-containerregistry (a
// static busybox from the host's busybox-static package), serve them from an
// in-process registry with basic auth, and drive nook through its CLI and
// REST API.
//
//	cd /work/main && go test -count=1 -v ./test/templates/
//
// NOOK_TEST_TPL_DATA overrides the data dir.
package templates

import (
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
	apiAddr   = "127.0.0.1:15000"
	proxyAddr = "127.0.0.1:15002"
	apiURL    = "http://" + apiAddr
	proxyURL  = "http://" + proxyAddr
	apiKey    = "nook-templates-test-key"
)

var (
	nookBin string
	dataDir = "/var/lib/nook-test-tpl"
	// srcDir holds OCI layouts and archives the server reads (same host).
	srcDir string
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "FAIL: the template tests need root (nook serve mounts file systems and runs runc)")
		return 1
	}
	if d := os.Getenv("NOOK_TEST_TPL_DATA"); d != "" {
		dataDir = d
	}
	repoRoot, err := testenv.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	binDir, err := os.MkdirTemp("", "nook-tpl-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	defer os.RemoveAll(binDir)
	if srcDir, err = os.MkdirTemp("", "nook-tpl-src-"); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	defer os.RemoveAll(srcDir)
	bins, err := testenv.Build(repoRoot, binDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	nookBin = bins.Nook
	if os.Getenv("NOOK_ROOTFS_CACHE") == "" {
		os.Setenv("NOOK_ROOTFS_CACHE", testenv.RootfsCache)
	}
	// No warm pool, so that every create boots and probes. The first start
	// builds the built-in templates (minutes).
	srv := &testenv.Server{
		Bin: nookBin, DataDir: dataDir, APIAddr: apiAddr, ProxyAddr: proxyAddr, APIKey: apiKey,
		Flags:   []string{"--pool-size", "0", "--network=false"},
		LogPath: filepath.Join(binDir, "serve.log"),
		Timeout: 20 * time.Minute,
	}
	if err := srv.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: start nook serve:", err)
		fmt.Fprintln(os.Stderr, "--- nook serve log (tail) ---\n"+srv.LogTail(60))
		return 1
	}
	code := m.Run()
	killAll()
	if code != 0 {
		fmt.Fprintln(os.Stderr, "--- nook serve log (tail) ---\n"+srv.LogTail(80))
	}
	srv.Stop()
	return code
}

// killAll kills every sandbox left running.
func killAll() {
	var list []struct {
		SandboxID string `json:"sandboxID"`
	}
	r, err := doAPI("GET", "/sandboxes", nil)
	if err != nil || json.Unmarshal(r.Body, &list) != nil {
		return
	}
	for _, s := range list {
		doAPI("DELETE", "/sandboxes/"+s.SandboxID, nil)
	}
}

type response struct {
	Status int
	Body   []byte
}

func (r response) String() string {
	return fmt.Sprintf("HTTP %d %s", r.Status, bytes.TrimSpace(r.Body))
}

func doAPI(method, path string, body any) (response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return response{}, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, apiURL+path, rd)
	if err != nil {
		return response{}, err
	}
	req.Header.Set("X-API-Key", apiKey)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return response{Status: resp.StatusCode, Body: b}, err
}

func api(t testing.TB, method, path string, body any) response {
	t.Helper()
	r, err := doAPI(method, path, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

// result is a finished nook CLI run.
type result struct {
	Stdout, Stderr string
	Code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit %d, stdout %q, stderr %q", r.Code, r.Stdout, r.Stderr)
}

// nook runs the CLI with the test server's flags after the first word.
func nook(t testing.TB, limit time.Duration, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	full := append([]string{args[0], "--api-url", apiURL, "--api-key", apiKey}, args[1:]...)
	if args[0] == "sandbox" {
		full = append([]string{"sandbox", "--api-url", apiURL, "--api-key", apiKey, "--sandbox-url", proxyURL}, args[1:]...)
	}
	c := exec.CommandContext(ctx, nookBin, full...)
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	err := c.Run()
	r := result{Stdout: stdout.String(), Stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		r.Code = exit.ExitCode()
	default:
		r.Code = -1
		r.Stderr += err.Error()
	}
	return r
}

func mustNook(t testing.TB, limit time.Duration, args ...string) string {
	t.Helper()
	r := nook(t, limit, args...)
	if r.Code != 0 {
		t.Fatalf("nook %s: %s", strings.Join(args, " "), r)
	}
	return r.Stdout
}

// newSandbox creates a sandbox of tpl and kills it when the test ends.
func newSandbox(t testing.TB, tpl string, env ...string) string {
	t.Helper()
	args := []string{"sandbox", "create", "-t", tpl}
	for _, e := range env {
		args = append(args, "-e", e)
	}
	id := strings.TrimSpace(mustNook(t, 2*time.Minute, args...))
	t.Cleanup(func() { doAPI("DELETE", "/sandboxes/"+id, nil) })
	return id
}

// run runs cmd in sandbox id (as its default user) and returns stdout.
func run(t testing.TB, id, cmd string) string {
	t.Helper()
	return mustNook(t, time.Minute, "sandbox", "run", id, "--", cmd)
}
