// Package native_test drives nook's native face (Cloudflare Sandbox 1.0
// semantics) through the Go SDK in sdk/go, plus nook exec and the envd path
// of the CubeSandbox table with its opt-ins, against a real nook serve
// built from this tree. It needs root (nook serve mounts and runs runc).
package native_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nookhq/nook/internal/store"
	"github.com/nookhq/nook/internal/template"
	nook "github.com/nookhq/nook/sdk/go"
	"github.com/nookhq/nook/test/testenv"
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
	root, err := testenv.RepoRoot()
	if err != nil {
		return 0, err
	}
	bins, err := testenv.Build(root, binDir)
	if err != nil {
		return 0, err
	}
	if os.Getenv("NOOK_ROOTFS_CACHE") == "" {
		os.Setenv("NOOK_ROOTFS_CACHE", testenv.RootfsCache)
	}
	srv := &testenv.Server{
		Bin: bins.Nook, DataDir: dataDir, APIAddr: apiAddr, ProxyAddr: proxyAddr, APIKey: apiKey,
		Flags:   []string{"--pool-size", "0", "--network=false"},
		LogPath: filepath.Join(os.TempDir(), "nook-test-native.log"),
		Timeout: 20 * time.Minute,
		Setpgid: true,
	}
	// First start builds the built-in templates; then register the test
	// templates in the store while nook serve is down, and start again.
	if err := srv.Start(); err != nil {
		return 0, err
	}
	srv.Stop()
	if err := registerTemplates(); err != nil {
		return 0, err
	}
	if err := srv.Start(); err != nil {
		return 0, err
	}
	defer srv.Stop()
	client = nook.NewClient(apiURL, apiKey)
	code := m.Run()
	killAll()
	return code, nil
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
