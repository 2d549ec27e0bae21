// Package native_test drives nook's native face (Cloudflare Sandbox 1.0
// semantics) through the Go SDK in sdk/go, plus nook exec and the envd path
// of the CubeSandbox table with its opt-ins, against a real nook serve
// built from this tree. It needs root (nook serve mounts and runs runc).
package native_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nookhq/nook/internal/store"
	"github.com/nookhq/nook/internal/template"
	nook "github.com/nookhq/nook/sdk/go"
)

const (
	dataDir   = "/var/lib/nook-test-native"
	apiAddr   = "127.0.0.1:17000"
	proxyAddr = "127.0.0.1:17002"
	apiKey    = "native-test-key"

	// Test templates registered straight in the store (test-only path):
	// base's root filesystem with an image ENV and a start command that
	// records its environment. The opt-in one turns on both options of the
	// CubeSandbox table.
	envTemplate      = "native-env"
	envOptInTemplate = "native-env-optin"
	mainEnvFile      = "/tmp/main-env"
	// The same on code-interpreter-v1 (run_code on port 49999).
	ciTemplate      = "native-ci-env"
	ciOptInTemplate = "native-ci-env-optin"
)

// imageEnv is the test templates' image env on top of base's.
var imageEnv = []string{"DEMO_ENV=template-only", "IMG_ONLY=from-image", "NODE_ENV=development"}

var (
	binDir string
	client *nook.Client
	apiURL = "http://" + apiAddr
)

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Println("test/native: skipped, needs root (nook serve mounts file systems and runs runc)")
		os.Exit(0)
	}
	code, err := setup(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "test/native:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func setup(m *testing.M) (int, error) {
	var err error
	if binDir, err = os.MkdirTemp("", "nook-native-bin-"); err != nil {
		return 0, err
	}
	defer os.RemoveAll(binDir)
	root, err := filepath.Abs("../..")
	if err != nil {
		return 0, err
	}
	for _, b := range []string{"nook", "nook-agent", "nook-interp"} {
		if _, err := os.Stat(filepath.Join(root, "cmd", b)); err != nil {
			continue
		}
		cmd := exec.Command(goBin(), "build", "-o", filepath.Join(binDir, b), "./cmd/"+b)
		cmd.Dir, cmd.Env = root, append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return 0, fmt.Errorf("build %s: %v\n%s", b, err, out)
		}
	}
	if os.Getenv("NOOK_ROOTFS_CACHE") == "" {
		os.Setenv("NOOK_ROOTFS_CACHE", "/var/lib/nook-rootfs-cache")
	}
	// First start builds the built-in templates; then register the test
	// templates in the store while nook serve is down, and start again.
	srv, err := startServe()
	if err != nil {
		return 0, err
	}
	srv.stop()
	if err := registerTemplates(); err != nil {
		return 0, err
	}
	if srv, err = startServe(); err != nil {
		return 0, err
	}
	defer srv.stop()
	client = nook.NewClient(apiURL, apiKey)
	code := m.Run()
	killAll()
	return code, nil
}

func goBin() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

type server struct {
	cmd *exec.Cmd
	log *os.File
}

func startServe() (*server, error) {
	log, err := os.OpenFile(filepath.Join(os.TempDir(), "nook-test-native.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(filepath.Join(binDir, "nook"), "serve", "--data-dir", dataDir, "--api-key", apiKey,
		"--listen", apiAddr, "--proxy-listen", proxyAddr, "--pool-size", "0", "--network=false")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &server{cmd: cmd, log: log}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(20 * time.Minute)
	for time.Now().Before(deadline) {
		resp, err := http.Get(apiURL + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode < 300 {
				return s, nil
			}
		}
		select {
		case <-exited:
			return nil, fmt.Errorf("nook serve exited; see %s", log.Name())
		case <-time.After(300 * time.Millisecond):
		}
	}
	s.stop()
	return nil, fmt.Errorf("nook serve did not come up; see %s", log.Name())
}

func (s *server) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { s.cmd.Process.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = s.cmd.Process.Kill()
	}
	s.log.Close()
}

func registerTemplates() error {
	st, err := store.Open(filepath.Join(dataDir, "nook.db"))
	if err != nil {
		return err
	}
	defer st.Close()
	reg, err := template.NewRegistry(st, dataDir)
	if err != nil {
		return err
	}
	base, err := reg.Get(template.BaseID)
	if err != nil {
		return err
	}
	ci, err := reg.Get(template.CodeInterpreterID)
	if err != nil {
		return err
	}
	for _, id := range []string{envTemplate, envOptInTemplate, ciTemplate, ciOptInTemplate} {
		t := base
		if id == ciTemplate || id == ciOptInTemplate {
			t = ci
		}
		t.ID, t.Aliases = id, nil
		t.Env = append(append([]string(nil), t.Env...), imageEnv...)
		if id == envTemplate || id == envOptInTemplate {
			t.Cmd = []string{"/bin/sh", "-c", "env > " + mainEnvFile + "; exec sleep infinity"}
		}
		t.EnvdInheritImageEnv = id == envOptInTemplate || id == ciOptInTemplate
		t.RunCodeInheritSandboxEnv = id == envOptInTemplate || id == ciOptInTemplate
		zero := 0
		t.PoolSize = &zero
		t.CreatedAt = time.Now().UTC()
		if err := reg.Put(t); err != nil {
			return err
		}
	}
	return nil
}

// ---- helpers ----

var created = map[string]bool{}

func killAll() {
	for id := range created {
		_ = client.SandboxByID(id).Destroy(context.Background())
	}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// named returns a fresh named sandbox (unique per test) from tpl.
func named(t *testing.T, tpl string) *nook.Sandbox {
	t.Helper()
	name := strings.NewReplacer("/", "-", "_", "-").Replace(strings.ToLower(t.Name()))
	if len(name) > 40 {
		name = name[:40]
	}
	name += fmt.Sprintf("-%d", time.Now().UnixNano()%1e9)
	sb, err := client.GetSandbox(ctxT(t, 60*time.Second), "tests", name, nook.SandboxOptions{Template: tpl, Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatalf("GetSandbox: %v", err)
	}
	created[sb.ID] = true
	t.Cleanup(func() {
		delete(created, sb.ID)
		_ = sb.Destroy(context.Background())
	})
	return sb
}

// run execs argv and returns its output, failing the test on error.
func run(t *testing.T, sb *nook.Sandbox, argv []string, o *nook.ExecOptions) nook.Output {
	t.Helper()
	ctx := ctxT(t, 60*time.Second)
	p, err := sb.Exec(ctx, argv, o)
	if err != nil {
		t.Fatalf("exec %v: %v", argv, err)
	}
	out, err := p.Output(ctx, &nook.OutputOptions{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("output of %v: %v", argv, err)
	}
	return out
}

func sh(t *testing.T, sb *nook.Sandbox, script string, o *nook.ExecOptions) string {
	t.Helper()
	out := run(t, sb, []string{"/bin/sh", "-c", script}, o)
	if out.ExitCode == nil || *out.ExitCode != 0 {
		t.Fatalf("%q: exit %v signal %v stderr %q", script, out.ExitCode, out.Signal, out.Stderr)
	}
	return out.Stdout
}
