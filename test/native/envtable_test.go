package native_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	apiclient "github.com/nookhq/nook/internal/client"
	nook "github.com/nookhq/nook/sdk/go"
)

// e2bSandbox creates a sandbox through the E2B-compatible API with create envs.
func e2bSandbox(t *testing.T, tpl string, envs map[string]string) string {
	t.Helper()
	c := &apiclient.Client{APIURL: apiURL, APIKey: apiKey}
	sb, err := c.Create(ctxT(t, time.Minute), apiclient.CreateRequest{TemplateID: tpl, Timeout: 600, EnvVars: envs})
	if err != nil {
		t.Fatalf("create from %s: %v", tpl, err)
	}
	created[sb.SandboxID] = true
	t.Cleanup(func() {
		delete(created, sb.SandboxID)
		_ = c.Kill(context.Background(), sb.SandboxID)
	})
	return sb.SandboxID
}

// nookCLI runs the nook binary against the test server.
func nookCLI(t *testing.T, stdin io.Reader, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "nook"), args...)
	cmd.Env = append(os.Environ(), "NOOK_API_URL="+apiURL, "NOOK_API_KEY="+apiKey, "NOOK_SANDBOX_URL=http://"+proxyAddr)
	cmd.Stdin = stdin
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("nook %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

const probe = `echo "${IMG_ONLY-unset}|${SBX_ONLY-unset}|${DEMO_ENV-unset}"`

// TestCubeSandboxTable checks every row and column of the CubeSandbox
// visibility table that Go reaches (envd commands.run through the proxy as
// `nook sandbox run` does, OCI exec through `nook exec`, the main process
// through the file its start command wrote), with both opt-ins off and on.
// The published-SDK version is test/e2e/env.test.mjs.
func TestCubeSandboxTable(t *testing.T) {
	for _, tc := range []struct {
		tpl string
		// envd commands.run without and with call envs
		envd, envdCall string
	}{
		{envTemplate, "unset|from-create|sandbox-only\n", "unset|from-create|one-shot\n"},
		{envOptInTemplate, "from-image|from-create|sandbox-only\n", "from-image|from-create|one-shot\n"},
	} {
		t.Run(tc.tpl, func(t *testing.T) {
			id := e2bSandbox(t, tc.tpl, map[string]string{"DEMO_ENV": "sandbox-only", "SBX_ONLY": "from-create"})
			// commands.run: sandbox env yes, image env only with the opt-in, call envs win.
			if out, errOut, code := nookCLI(t, nil, "sandbox", "run", id, "--", probe); out != tc.envd || code != 0 {
				t.Errorf("commands.run: %q (exit %d, %s), want %q", out, code, errOut, tc.envd)
			}
			if out, errOut, code := nookCLI(t, nil, "sandbox", "run", "-e", "DEMO_ENV=one-shot", id, "--", probe); out != tc.envdCall || code != 0 {
				t.Errorf("commands.run with call envs: %q (exit %d, %s), want %q", out, code, errOut, tc.envdCall)
			}
			// The call's envs were for that call only.
			if out, _, _ := nookCLI(t, nil, "sandbox", "run", id, "--", probe); out != tc.envd {
				t.Errorf("commands.run after a call with envs: %q", out)
			}
			// OCI exec: image env only.
			if out, errOut, code := nookCLI(t, nil, "exec", id, "--", "/bin/sh", "-c", probe); out != "from-image|unset|template-only\n" || code != 0 {
				t.Errorf("nook exec: %q (exit %d, %s)", out, code, errOut)
			}
			// Main process (the template's start command): image env only.
			out, errOut, code := nookCLI(t, nil, "exec", id, "--", "cat", mainEnvFile)
			if code != 0 || !strings.Contains(out, "DEMO_ENV=template-only\n") || !strings.Contains(out, "IMG_ONLY=from-image\n") || strings.Contains(out, "SBX_ONLY") || strings.Contains(out, "sandbox-only") {
				t.Errorf("main process env: %q (exit %d, %s)", out, code, errOut)
			}
			// Native exec: image env, then the sandbox env (create envs), then launch env.
			sb := client.SandboxByID(id)
			if got := sh(t, sb, probe, nil); got != "from-image|from-create|sandbox-only\n" {
				t.Errorf("native exec: %q", got)
			}
			// Native terminal: image env + launch env, no sandbox env.
			term, err := sb.CreateTerminal(ctxT(t, time.Minute), &nook.TerminalOptions{Command: []string{"/bin/sh", "-c", probe}})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := term.WaitForExit(ctxT(t, time.Minute), 20*time.Second); err != nil {
				t.Fatal(err)
			}
			o, _ := term.Output(ctxT(t, time.Minute), nil, nil)
			if got := eventsText(o); !strings.Contains(got, "from-image|unset|template-only") {
				t.Errorf("native terminal: %q", got)
			}
		})
	}
}

// nook exec: exit codes, stdin, -w, -u, errors, and it works while the
// agent is wedged.
func TestOCIExec(t *testing.T) {
	id := e2bSandbox(t, envTemplate, nil)
	if _, _, code := nookCLI(t, nil, "exec", id, "--", "/bin/sh", "-c", "exit 5"); code != 5 {
		t.Errorf("exit code: %d, want 5", code)
	}
	if out, _, code := nookCLI(t, strings.NewReader("hello stdin\n"), "exec", "-i", id, "--", "cat"); out != "hello stdin\n" || code != 0 {
		t.Errorf("stdin: %q exit %d", out, code)
	}
	if out, _, _ := nookCLI(t, nil, "exec", "-w", "/tmp", "-u", "user", id, "--", "/bin/sh", "-c", `echo "$(pwd)|$(id -un)|$HOME"`); out != "/tmp|user|/home/user\n" {
		t.Errorf("-w/-u: %q", out)
	}
	if out, errOut, _ := nookCLI(t, nil, "exec", id, "--", "/bin/sh", "-c", "echo out; echo err >&2"); out != "out\n" || errOut != "err\n" {
		t.Errorf("streams: %q %q", out, errOut)
	}
	// The sandbox's seccomp filter holds for nook exec too (it is not
	// runc's: the agent installs it), as root and as another user.
	for _, user := range []string{"root", "user"} {
		out, errOut, code := nookCLI(t, nil, "exec", "-u", user, id, "--", "/bin/sh", "-c", "grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status; unshare -U true && echo UNSHARED; exit 0")
		if code != 0 || !strings.Contains(out, "Seccomp:\t2") || !strings.Contains(out, "NoNewPrivs:\t1") || strings.Contains(out, "UNSHARED") {
			t.Errorf("SECURITY: nook exec as %s: %q (exit %d, %s), want seccomp filter mode 2, no_new_privs and unshare refused", user, out, code, errOut)
		}
	}
	if _, errOut, code := nookCLI(t, nil, "exec", id, "--", "no-such-command"); code != 127 || !strings.Contains(errOut, "no-such-command") {
		t.Errorf("missing command: exit %d, %q; want 127 naming it", code, errOut)
	}
	if _, errOut, code := nookCLI(t, nil, "exec", "inosuchsandbox", "--", "true"); code == 0 || !strings.Contains(errOut, "not found") {
		t.Errorf("unknown sandbox: exit %d, %q", code, errOut)
	}
	if _, errOut, code := nookCLI(t, nil, "exec", "-u", "nobody-here", id, "--", "true"); code == 0 || !strings.Contains(errOut, "nobody-here") {
		t.Errorf("unknown user: exit %d, %q", code, errOut)
	}
	// Wedge the agent (SIGSTOP its PID 1): envd stops answering, nook exec does not care.
	pid := agentHostPid(t, id)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(pid, syscall.SIGCONT)
	if out, errOut, code := nookCLI(t, nil, "exec", id, "--", "/bin/sh", "-c", "echo alive; grep State /proc/1/status"); code != 0 || !strings.Contains(out, "alive") || !strings.Contains(out, "stopped") {
		t.Errorf("exec with a wedged agent: %q (exit %d, %s)", out, code, errOut)
	}
}

func agentHostPid(t *testing.T, id string) int {
	t.Helper()
	out, err := exec.Command("runc", "--root", filepath.Join(dataDir, "runc"), "state", id).Output()
	if err != nil {
		t.Fatalf("runc state: %v", err)
	}
	var st struct{ Pid int }
	if err := json.Unmarshal(out, &st); err != nil || st.Pid == 0 {
		t.Fatalf("runc state: %s", out)
	}
	return st.Pid
}

// nook exec -it: a real interactive terminal (raw mode, window size
// followed, exit code passed through), with the image env.
func TestOCIExecInteractiveTerminal(t *testing.T) {
	id := e2bSandbox(t, envTemplate, map[string]string{"SBX_ONLY": "from-create"})
	cmd := exec.Command(filepath.Join(binDir, "nook"), "exec", "-it", id, "--", "/bin/sh")
	cmd.Env = append(os.Environ(), "NOOK_API_URL="+apiURL, "NOOK_API_KEY="+apiKey, "TERM=xterm-256color")
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Cols: 100, Rows: 30})
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	out := make(chan string, 1024)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := ptmx.Read(buf)
			if n > 0 {
				out <- string(buf[:n])
			}
			if err != nil {
				close(out)
				return
			}
		}
	}()
	var screen strings.Builder
	seen := 0 // the screen up to here is matched already
	until := func(want string) {
		t.Helper()
		deadline := time.After(20 * time.Second)
		for {
			// One read may bring several expected lines: search from the
			// end of the last match, not from the end of the last read.
			if i := strings.Index(screen.String()[seen:], want); i >= 0 {
				seen += i + len(want)
				return
			}
			select {
			case s, ok := <-out:
				if !ok {
					t.Fatalf("terminal closed before %q: %q", want, screen.String())
				}
				screen.WriteString(s)
			case <-deadline:
				t.Fatalf("no %q on the terminal: %q", want, screen.String()[seen:])
			}
		}
	}
	// Raw mode: nook passes \r through; the sandbox's terminal turns it into a newline.
	ptmx.Write([]byte("stty size; echo \"E:$TERM:$DEMO_ENV:${SBX_ONLY-unset}:\"\r"))
	until("30 100")
	until("E:xterm-256color:template-only:unset:")
	if err := pty.Setsize(ptmx, &pty.Winsize{Cols: 120, Rows: 40}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	ptmx.Write([]byte("stty size\r"))
	until("40 120")
	ptmx.Write([]byte("exit 4\r"))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 4 {
			t.Errorf("nook exec -it exit: %v, want code 4", err)
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatal("nook exec -it did not exit")
	}
}

// runCode executes Python through the sandbox's code interpreter (port
// 49999 through the proxy, as the code-interpreter SDK does) and returns the
// raw answer stream.
func runCode(t *testing.T, id, token, code string, envs map[string]string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"code": code, "language": "python", "env_vars": envs})
	req, _ := http.NewRequestWithContext(ctxT(t, 90*time.Second), http.MethodPost, "http://"+proxyAddr+"/execute", bytes.NewReader(body))
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49999")
	req.Header.Set("X-Access-Token", token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("run_code: %v", err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("run_code: %s: %s", resp.Status, data)
	}
	return string(data)
}

// The run_code column: image env yes; sandbox env only with the opt-in;
// the execution's envs for that execution only.
func TestCubeSandboxTableRunCode(t *testing.T) {
	for _, tc := range []struct {
		tpl, want string
	}{
		{ciTemplate, "R:from-image|unset|template-only:"},
		{ciOptInTemplate, "R:from-image|from-create|sandbox-only:"},
	} {
		t.Run(tc.tpl, func(t *testing.T) {
			c := &apiclient.Client{APIURL: apiURL, APIKey: apiKey}
			sb, err := c.Create(ctxT(t, 2*time.Minute), apiclient.CreateRequest{TemplateID: tc.tpl, Timeout: 600,
				EnvVars: map[string]string{"DEMO_ENV": "sandbox-only", "SBX_ONLY": "from-create"}})
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			created[sb.SandboxID] = true
			t.Cleanup(func() { delete(created, sb.SandboxID); _ = c.Kill(context.Background(), sb.SandboxID) })
			code := `import os; g=os.environ.get; print("R:%s|%s|%s:" % (g("IMG_ONLY","unset"), g("SBX_ONLY","unset"), g("DEMO_ENV","unset")))`
			if got := runCode(t, sb.SandboxID, sb.EnvdAccessToken, code, nil); !strings.Contains(got, tc.want) {
				t.Errorf("run_code: %s, want %q", got, tc.want)
			}
			if got := runCode(t, sb.SandboxID, sb.EnvdAccessToken, code, map[string]string{"DEMO_ENV": "one-exec"}); !strings.Contains(got, "|one-exec:") {
				t.Errorf("run_code with envs: %s", got)
			}
			if got := runCode(t, sb.SandboxID, sb.EnvdAccessToken, code, nil); !strings.Contains(got, tc.want) {
				t.Errorf("run_code after an execution with envs: %s, want %q", got, tc.want)
			}
		})
	}
}
