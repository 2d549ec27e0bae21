package templates

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// optIns is what GET /templates/{id} (and `nook tpl info`) shows of a
// template's env opt-ins and default network.
type optIns struct {
	EnvdInheritImageEnv      bool     `json:"envdInheritImageEnv"`
	RunCodeInheritSandboxEnv bool     `json:"runCodeInheritSandboxEnv"`
	CodeInterpreter          bool     `json:"codeInterpreter"`
	AllowInternetAccess      bool     `json:"allowInternetAccess"`
	AllowOut                 []string `json:"allowOut"`
	DenyOut                  []string `json:"denyOut"`
}

func tplOptIns(t *testing.T, id string) optIns {
	t.Helper()
	var o optIns
	out := mustNook(t, time.Minute, "tpl", "info", id)
	if err := json.Unmarshal([]byte(out), &o); err != nil {
		t.Fatalf("tpl info %s: %v in %q", id, err, out)
	}
	return o
}

// TestEnvdInheritImageEnv: by default commands.run does not see the image
// env (the CubeSandbox table); a template made with
// --envd-inherit-image-env lets it see the image env and --env, with the
// sandbox env and the call's envs over them.
func TestEnvdInheritImageEnv(t *testing.T) {
	lp, err := layout.Write(filepath.Join(srcDir, "optin"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(appImage(t)); err != nil {
		t.Fatal(err)
	}
	src := "oci-layout:" + filepath.Join(srcDir, "optin")
	off := createFromImage(t, "--image", src, "--alias", "optin-off", "--env", "TPL=from-flag")
	on := createFromImage(t, "--image", src, "--alias", "optin-on", "--env", "TPL=from-flag", "--envd-inherit-image-env",
		"--allow-internet-access=false", "--allow-out-cidr", "10.9.0.0/16", "--deny-out-cidr", "10.9.1.7")
	if o := tplOptIns(t, off.TemplateID); o.EnvdInheritImageEnv || !o.AllowInternetAccess || len(o.AllowOut)+len(o.DenyOut) != 0 {
		t.Errorf("template without opt-ins: %+v", o)
	}
	o := tplOptIns(t, on.TemplateID)
	if !o.EnvdInheritImageEnv || o.RunCodeInheritSandboxEnv || o.AllowInternetAccess ||
		fmt.Sprint(o.AllowOut) != "[10.9.0.0/16]" || fmt.Sprint(o.DenyOut) != "[10.9.1.7/32]" {
		t.Errorf("template with opt-ins: %+v", o)
	}

	const probe = `echo "[$IMG] [$TPL] [$OVER] [$SBX]"`
	idOff := newSandbox(t, "optin-off", "SBX=from-create", "OVER=from-create")
	if got := strings.TrimSpace(run(t, idOff, probe)); got != "[] [] [from-create] [from-create]" {
		t.Errorf("default (seed table): commands.run saw %q, want no image env", got)
	}
	idOn := newSandbox(t, "optin-on", "SBX=from-create", "OVER=from-create")
	if got := strings.TrimSpace(run(t, idOn, probe)); got != "[from-image] [from-flag] [from-create] [from-create]" {
		t.Errorf("--envd-inherit-image-env: commands.run saw %q, want the image env under the sandbox env", got)
	}
	if got := strings.TrimSpace(mustNook(t, time.Minute, "sandbox", "run", "-e", "IMG=from-call", idOn, "--", probe)); got != "[from-call] [from-flag] [from-create] [from-create]" {
		t.Errorf("call envs must win: %q", got)
	}

	// PATCH turns it off again for new sandboxes.
	if r := api(t, "PATCH", "/templates/optin-on", map[string]any{"envdInheritImageEnv": false, "allowInternetAccess": true, "denyOut": []string{}}); r.Status != http.StatusOK {
		t.Fatalf("PATCH: %s", r)
	}
	if o := tplOptIns(t, "optin-on"); o.EnvdInheritImageEnv || !o.AllowInternetAccess || len(o.DenyOut) != 0 || fmt.Sprint(o.AllowOut) != "[10.9.0.0/16]" {
		t.Errorf("after PATCH: %+v", o)
	}
	idOn2 := newSandbox(t, "optin-on", "SBX=from-create")
	if got := strings.TrimSpace(run(t, idOn2, `echo "[$IMG]"`)); got != "[]" {
		t.Errorf("after PATCH off: %q", got)
	}

	// Bad values are a clear 400.
	for _, body := range []map[string]any{
		{"image": src, "allowOut": []string{"example.com"}},
		{"image": src, "denyOut": []string{"10.0.0.0/40"}},
	} {
		if r := api(t, "POST", "/templates", body); r.Status != http.StatusBadRequest || !strings.Contains(string(r.Body), "want a CIDR") {
			t.Errorf("POST %v: %s", body, r)
		}
	}
}

// runCode runs Python code in a sandbox's code interpreter (port 49999)
// through the proxy and returns the raw answer.
func runCode(t *testing.T, id, code string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"code": code})
	req, _ := http.NewRequest("POST", proxyURL+"/execute", strings.NewReader(string(body)))
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49999")
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("run_code: %d %s", resp.StatusCode, out)
	}
	return string(out)
}

// TestRunCodeInheritEnv: a Dockerfile template FROM code-interpreter-v1
// keeps its code interpreter; with --run-code-inherit-env run_code sees the
// sandbox env from create, without it only the image env.
func TestRunCodeInheritEnv(t *testing.T) {
	ctxDir := t.TempDir()
	os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte("FROM code-interpreter-v1\nENV FROM_IMAGE=img\n"), 0o644)
	t.Cleanup(func() { doAPI("DELETE", "/templates/ci-inherit", nil) })
	if r := nook(t, 5*time.Minute, "tpl", "build", "--alias", "ci-inherit", "--run-code-inherit-env", ctxDir); r.Code != 0 {
		t.Fatalf("build: %s", r)
	}
	if o := tplOptIns(t, "ci-inherit"); !o.CodeInterpreter || !o.RunCodeInheritSandboxEnv || o.EnvdInheritImageEnv {
		t.Fatalf("ci-inherit: %+v", o)
	}
	const code = `import os; print("SBX=%s IMG=%s" % (os.environ.get("SBX"), os.environ.get("FROM_IMAGE")))`
	on := newSandbox(t, "ci-inherit", "SBX=from-create")
	if got := runCode(t, on, code); !strings.Contains(got, "SBX=from-create IMG=img") {
		t.Errorf("--run-code-inherit-env: run_code answered %s", got)
	}
	off := newSandbox(t, "code-interpreter-v1", "SBX=from-create")
	if got := runCode(t, off, code); !strings.Contains(got, "SBX=None") {
		t.Errorf("default: run_code answered %s", got)
	}
}
