package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain lets the tests run this binary's main as nook-agent.
func TestMain(m *testing.M) {
	if os.Getenv("NOOK_AGENT_TEST_MAIN") == "1" {
		os.Args = append([]string{"nook-agent"}, os.Args[1:]...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// seccomp-exec never runs the command without its filter in place: a
// missing or malformed filter ends it (exit 126) before the exec.
func TestSeccompExecFailsClosed(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.bpf")
	if err := os.WriteFile(bad, []byte("1234567"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, filter := range []string{filepath.Join(t.TempDir(), "missing.bpf"), bad} {
		cmd := exec.Command(os.Args[0], "seccomp-exec", filter, "--", "/bin/echo", "RAN")
		cmd.Env = append(os.Environ(), "NOOK_AGENT_TEST_MAIN=1")
		out, err := cmd.CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 126 || strings.Contains(string(out), "RAN") {
			t.Errorf("filter %s: %v, output %q; want exit 126 and the command not run", filepath.Base(filter), err, out)
		}
	}
}
