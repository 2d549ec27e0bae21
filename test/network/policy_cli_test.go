package network

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// nookCLI runs the nook CLI against the test server; the client flags go
// after the first word (the command group).
func nookCLI(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	full := append([]string{args[0], "--api-url", apiURL, "--api-key", apiKey}, args[1:]...)
	out, err := exec.CommandContext(ctx, nookBin, full...).CombinedOutput()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return string(out), ee.ExitCode()
		}
		t.Fatalf("nook %v: %v", args, err)
	}
	return string(out), 0
}

func mustCLI(t *testing.T, args ...string) string {
	t.Helper()
	out, code := nookCLI(t, args...)
	if code != 0 {
		t.Fatalf("nook %s: exit %d:\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

// TestTemplateDefaultPolicy: a template made with the CubeSandbox flags
// --allow-internet-access=false --allow-out-cidr gives its sandboxes that
// policy; a create's allow_internet_access / network.allowOut replace the
// template's value of that field only.
func TestTemplateDefaultPolicy(t *testing.T) {
	ctxDir := t.TempDir()
	os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte("FROM base\nENV NET_TEMPLATE=locked\n"), 0o644)

	// Bad CIDRs are refused up front.
	if out, code := nookCLI(t, "tpl", "build", "--alias", "net-bad", "--deny-out-cidr", "example.com", ctxDir); code == 0 || !strings.Contains(out, "want a CIDR") {
		t.Fatalf("bad --deny-out-cidr: exit %d:\n%s", code, out)
	}
	api(t, "DELETE", "/templates/net-bad", nil)

	t.Cleanup(func() { api(t, "DELETE", "/templates/net-locked", nil) })
	mustCLI(t, "tpl", "build", "--alias", "net-locked", "--allow-internet-access=false", "--allow-out-cidr", ipA, ctxDir)
	var info struct {
		AllowInternetAccess bool     `json:"allowInternetAccess"`
		AllowOut            []string `json:"allowOut"`
		DenyOut             []string `json:"denyOut"`
	}
	if err := json.Unmarshal([]byte(mustCLI(t, "tpl", "info", "net-locked")), &info); err != nil {
		t.Fatal(err)
	}
	if info.AllowInternetAccess || strings.Join(info.AllowOut, ",") != ipA+"/32" || len(info.DenyOut) != 0 {
		t.Fatalf("tpl info: %+v", info)
	}

	// The template's policy: only ipA.
	locked := create(t, map[string]any{"templateID": "net-locked"})
	wantOK(t, locked, "http://"+ipA+":8080/", "hello from "+ipA)
	wantRefused(t, locked, "http://"+ipB+":8080/")
	if out := mustCLI(t, "sandbox", "network", locked); !strings.Contains(out, "internet:       false") || !strings.Contains(out, ipA+"/32") {
		t.Fatalf("sandbox network shows:\n%s", out)
	}

	// The create turns internet on: the template's allowOut stays.
	on := create(t, map[string]any{"templateID": "net-locked", "allow_internet_access": true})
	wantOK(t, on, "http://"+ipB+":8080/", "hello from "+ipB)
	wantOK(t, on, "http://"+ipA+":8080/", "hello from "+ipA)

	// The create gives its own allowOut: internet stays off (template),
	// allowOut is the create's.
	other := create(t, map[string]any{"templateID": "net-locked", "network": map[string]any{"allowOut": []string{ipB}}})
	wantOK(t, other, "http://"+ipB+":8080/", "hello from "+ipB)
	wantRefused(t, other, "http://"+ipA+":8080/")

	// The base template is unchanged.
	plain := create(t, nil)
	wantOK(t, plain, "http://"+ipB+":8080/", "hello from "+ipB)
}

// TestNetworkCLI: `nook sandbox network` shows and changes the live policy
// field by field, keeps API-set rules (whose secrets it never shows), and
// --replace resets it.
func TestNetworkCLI(t *testing.T) {
	const secret = "sk-cli-test-42b9e0"
	id := create(t, nil)
	code, out := api(t, "PUT", "/v1/sandboxes/"+id+"/network", map[string]any{
		"rules": map[string]any{"secret.test": []any{map[string]any{"transform": map[string]any{"headers": map[string]string{"X-Api-Key": secret}}}}}})
	if code != 204 {
		t.Fatalf("PUT: %d %s", code, out)
	}
	wantOK(t, id, "http://"+ipB+":8080/", "hello")

	mustCLI(t, "sandbox", "network", id, "--internet=false", "--allow-out-cidr", ipA)
	wantRefused(t, id, "http://"+ipB+":8080/")
	wantOK(t, id, "http://"+ipA+":8080/", "hello")
	seenMu.Lock()
	delete(seen, "secret.test")
	seenMu.Unlock()
	wantOK(t, id, "http://secret.test/", "hello from secret.test")
	seenMu.Lock()
	got := seen["secret.test"].Get("X-Api-Key")
	seenMu.Unlock()
	if got != secret {
		t.Fatalf("the rule set through the API was lost by the CLI change: server got X-Api-Key %q", got)
	}

	js := mustCLI(t, "sandbox", "network", id, "--show", "--json")
	var pol struct {
		EnableInternet bool             `json:"enableInternet"`
		AllowOut       []string         `json:"allowOut"`
		Rules          map[string][]any `json:"rules"`
	}
	if err := json.Unmarshal([]byte(js), &pol); err != nil {
		t.Fatalf("%v in %s", err, js)
	}
	if pol.EnableInternet || strings.Join(pol.AllowOut, ",") != ipA+"/32" || len(pol.Rules["secret.test"]) != 1 {
		t.Fatalf("--show --json: %s", js)
	}
	if strings.Contains(js, secret) || !strings.Contains(js, `"***"`) {
		t.Fatalf("the CLI shows the secret:\n%s", js)
	}
	if code, body := api(t, "GET", "/v1/sandboxes/"+id+"/network", nil); code != 200 || strings.Contains(string(body), secret) {
		t.Fatalf("GET: %d %s", code, body)
	}

	// Host globs.
	mustCLI(t, "sandbox", "network", id, "--internet=true", "--deny-host", "*.allowed.test")
	wantRefused(t, id, "http://www.allowed.test/")
	wantOK(t, id, "http://"+ipB+":8080/", "hello")
	mustCLI(t, "sandbox", "network", id, "--deny-host", "")
	wantOK(t, id, "http://www.allowed.test/", "hello from www.allowed.test")
	mustCLI(t, "sandbox", "network", id, "--allow-host", "allowed.test")
	wantOK(t, id, "http://allowed.test/", "hello")
	wantRefused(t, id, "http://plain.test/")

	// --replace: the flags are the whole policy; the rule is gone.
	out2 := mustCLI(t, "sandbox", "network", id, "--replace", "--deny-out-cidr", ipA, "--show")
	if !strings.Contains(out2, "deny-out-cidr:  "+ipA+"/32") || !strings.Contains(out2, "header rules:   -") {
		t.Fatalf("--replace shows:\n%s", out2)
	}
	wantOK(t, id, "http://"+ipB+":8080/", "hello")
	wantRefused(t, id, "http://"+ipA+":8080/")

	// Bad input: clear errors, nothing changed.
	if out, code := nookCLI(t, "sandbox", "network", id, "--allow-out-cidr", "not-a-cidr"); code == 0 || !strings.Contains(out, "want a CIDR") {
		t.Errorf("bad CIDR: exit %d %s", code, out)
	}
	if out, code := nookCLI(t, "sandbox", "network", id, "--deny-host", "bad host"); code == 0 || !strings.Contains(out, "invalid host pattern") {
		t.Errorf("bad glob: exit %d %s", code, out)
	}
	if out, code := nookCLI(t, "sandbox", "network", "nosuchsandbox"); code == 0 || !strings.Contains(out, "not found") {
		t.Errorf("unknown sandbox: exit %d %s", code, out)
	}
	wantRefused(t, id, "http://"+ipA+":8080/")
}
