package interp

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"
)

type collected struct {
	events []Event
}

func (c *collected) emit(ev Event) { c.events = append(c.events, ev) }

func (c *collected) text(kind string) string {
	var b strings.Builder
	for _, ev := range c.events {
		if ev["type"] == kind {
			b.WriteString(ev["text"].(string))
		}
	}
	return b.String()
}

func (c *collected) first(kind string) Event {
	for _, ev := range c.events {
		if ev["type"] == kind {
			return ev
		}
	}
	return nil
}

func startKernel(t *testing.T, bin string, start Starter) Kernel {
	t.Helper()
	if _, err := exec.LookPath(bin); err != nil {
		t.Fatalf("%s not installed (scripts/install-deps.sh installs it)", bin)
	}
	k, err := start(KernelOptions{Cwd: t.TempDir(), Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "KEEP=image"}, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	return k
}

func run(t *testing.T, k Kernel, code string, env map[string]string) *collected {
	t.Helper()
	c := &collected{}
	if err := k.Execute(code, env, c.emit); err != nil {
		t.Fatalf("execute %q: %v", code, err)
	}
	return c
}

func TestNodeKernel(t *testing.T) {
	k := startKernel(t, "node", StartNode)
	run(t, k, "let x = 40; const f = (a) => a + 2", nil)
	c := run(t, k, "console.log('hi'); console.error('oops'); f(x)", nil)
	if got := c.text("stdout"); got != "hi\n" {
		t.Errorf("stdout %q", got)
	}
	if got := c.text("stderr"); got != "oops\n" {
		t.Errorf("stderr %q", got)
	}
	if r := c.first("result"); r == nil || r["text"] != "42" || r["is_main_result"] != true {
		t.Errorf("result %v", r)
	}
	c = run(t, k, "await new Promise(r => setTimeout(() => r('later'), 10))", nil)
	if r := c.first("result"); r == nil || r["text"] != "'later'" {
		t.Errorf("await result %v", c.events)
	}
	c = run(t, k, "throw new TypeError('bad')", nil)
	if e := c.first("error"); e == nil || e["name"] != "TypeError" || e["value"] != "bad" {
		t.Errorf("error %v", c.events)
	}
	c = run(t, k, "process.env.FOO + ' ' + process.env.KEEP", map[string]string{"FOO": "bar", "KEEP": "call"})
	if r := c.first("result"); r == nil || r["text"] != "'bar call'" {
		t.Errorf("env %v", c.events)
	}
	c = run(t, k, "[process.env.FOO, process.env.KEEP]", nil)
	if r := c.first("result"); r == nil || r["text"] != "[ undefined, 'image' ]" {
		t.Errorf("env restored %v", c.events)
	}
	// Interrupt a busy loop; state survives.
	done := make(chan error, 1)
	c = &collected{}
	go func() { done <- k.Execute("while (true) {}", nil, c.emit) }()
	time.Sleep(300 * time.Millisecond)
	if err := k.Interrupt(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err, c.events)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("interrupt did not stop the loop")
	}
	if c.first("error") == nil {
		t.Errorf("no error after interrupt: %v", c.events)
	}
	c = run(t, k, "x", nil)
	if r := c.first("result"); r == nil || r["text"] != "40" {
		t.Errorf("state after interrupt %v", c.events)
	}
}

func TestBashKernel(t *testing.T) {
	k := startKernel(t, "bash", StartBash)
	run(t, k, "X=41; f() { echo $((X+1)); }; cd /", nil)
	c := run(t, k, "f; pwd; echo err >&2; printf 'no newline'", nil)
	if got := c.text("stdout"); got != "42\n/\nno newline" {
		t.Errorf("stdout %q", got)
	}
	if got := c.text("stderr"); got != "err\n" {
		t.Errorf("stderr %q", got)
	}
	c = run(t, k, "false", nil)
	if e := c.first("error"); e == nil || e["value"] != "1" {
		t.Errorf("exit status %v", c.events)
	}
	c = run(t, k, "echo $FOO/$KEEP", map[string]string{"FOO": "a b'c", "KEEP": "call"})
	if got := c.text("stdout"); got != "a b'c/call\n" {
		t.Errorf("env %q", got)
	}
	c = run(t, k, "echo ${FOO-unset}/$KEEP", nil)
	if got := c.text("stdout"); got != "unset/image\n" {
		t.Errorf("env restored %q", got)
	}
	done := make(chan error, 1)
	c = &collected{}
	go func() { done <- k.Execute("while true; do :; done", nil, c.emit) }()
	time.Sleep(300 * time.Millisecond)
	_ = k.Interrupt()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("interrupt did not stop the loop")
	}
	c = run(t, k, "f", nil)
	if got := c.text("stdout"); got != "42\n" {
		t.Errorf("state after interrupt %q", got)
	}
	// exit kills the shell: reported as a dead kernel.
	if err := k.Execute("exit 3", nil, (&collected{}).emit); err != ErrKernelDied {
		t.Errorf("exit: %v", err)
	}
}

func TestPythonKernel(t *testing.T) {
	if exec.Command("/usr/bin/python3", "-c", "import ipykernel").Run() != nil {
		t.Fatal("python3-ipykernel not installed (scripts/install-deps.sh installs it)")
	}
	k := startKernel(t, "python3", StartPython)
	run(t, k, "x = 41", nil)
	c := run(t, k, "import sys, os\nprint('hi'); print('oops', file=sys.stderr)\nx + 1", nil)
	if got := c.text("stdout"); got != "hi\n" {
		t.Errorf("stdout %q", got)
	}
	if got := c.text("stderr"); got != "oops\n" {
		t.Errorf("stderr %q", got)
	}
	if r := c.first("result"); r == nil || r["text"] != "42" || r["is_main_result"] != true {
		t.Errorf("result %v", c.events)
	}
	if n := c.first("number_of_executions"); n == nil {
		t.Errorf("no execution count %v", c.events)
	}
	c = run(t, k, "1/0", nil)
	if e := c.first("error"); e == nil || e["name"] != "ZeroDivisionError" || !strings.Contains(e["traceback"].(string), "ZeroDivisionError") {
		t.Errorf("error %v", c.events)
	}
	c = run(t, k, "os.environ['FOO'] + os.environ['KEEP']", map[string]string{"FOO": "bar", "KEEP": "call"})
	if r := c.first("result"); r == nil || r["text"] != "'barcall'" {
		t.Errorf("env %v", c.events)
	}
	c = run(t, k, "(os.environ.get('FOO'), os.environ['KEEP'])", nil)
	if r := c.first("result"); r == nil || r["text"] != "(None, 'image')" {
		t.Errorf("env restored %v", c.events)
	}
	c = run(t, k, "from IPython.display import HTML, display\ndisplay(HTML('<b>x</b>'))", nil)
	if r := c.first("result"); r == nil || r["html"] != "<b>x</b>" || r["is_main_result"] != false {
		t.Errorf("display %v", c.events)
	}
	done := make(chan error, 1)
	c = &collected{}
	go func() { done <- k.Execute("while True: pass", nil, c.emit) }()
	time.Sleep(500 * time.Millisecond)
	_ = k.Interrupt()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("interrupt did not stop the loop")
	}
	if e := c.first("error"); e == nil || e["name"] != "KeyboardInterrupt" {
		t.Errorf("interrupt %v", c.events)
	}
	c = run(t, k, "x", nil)
	if r := c.first("result"); r == nil || r["text"] != "41" {
		t.Errorf("state after interrupt %v", c.events)
	}
}

// TestPythonKernelOutput checks what the per-cell shortcuts of
// python_startup.py must keep: they are installed, and printed output and
// results around flushes still arrive with their cell, on both streams.
func TestPythonKernelOutput(t *testing.T) {
	if exec.Command("/usr/bin/python3", "-c", "import ipykernel").Run() != nil {
		t.Fatal("python3-ipykernel not installed (scripts/install-deps.sh installs it)")
	}
	k := startKernel(t, "python3", StartPython)
	c := run(t, k, "k = get_ipython().kernel\n(k._execute_sleep, k.log.level)", nil)
	if r := c.first("result"); r == nil || r["text"] != "(0.0, 30)" {
		t.Errorf("the per-cell shortcuts of python_startup.py are not installed: %v", c.events)
	}
	for i := 0; i < 20; i++ {
		c = run(t, k, "import sys\nsys.stdout.flush()\nprint('a')\nsys.stdout.flush()\nprint('b', file=sys.stderr)\n7", nil)
		if c.text("stdout") != "a\n" || c.text("stderr") != "b\n" || c.first("result") == nil || c.first("result")["text"] != "7" {
			t.Fatalf("run %d: %v", i, c.events)
		}
	}
}

func BenchmarkPythonOnePlusOne(b *testing.B) {
	k, err := StartPython(KernelOptions{Cwd: b.TempDir(), Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"}, Dir: b.TempDir()})
	if err != nil {
		b.Skip(err)
	}
	defer k.Close()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		got := ""
		if err := k.Execute("1+1", nil, func(ev Event) {
			if ev["type"] == "result" {
				got, _ = ev["text"].(string)
			}
		}); err != nil || got != "2" {
			b.Fatal(err, got)
		}
	}
}

// TestServer drives the HTTP protocol with the Bash kernel (always there).
func TestServer(t *testing.T) {
	s := New(Config{Env: []string{"PATH=/usr/bin:/bin"}, StateDir: t.TempDir(), DefaultCwd: "/",
		Starters: map[string]Starter{"bash": StartBash}})
	defer s.Close()
	s.Warm()
	ts := httptest.NewServer(s)
	defer ts.Close()
	post := func(path, body string) (*http.Response, []Event) {
		resp, err := http.Post(ts.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var evs []Event
		dec := json.NewDecoder(resp.Body)
		for {
			var ev Event
			if dec.Decode(&ev) != nil {
				break
			}
			evs = append(evs, ev)
		}
		return resp, evs
	}
	resp, evs := post("/execute", `{"code":"echo hi","language":"bash"}`)
	if resp.StatusCode != 200 || len(evs) < 2 || evs[0]["text"] != "hi\n" || evs[len(evs)-1]["type"] != "end_of_execution" {
		t.Fatalf("execute: %d %v", resp.StatusCode, evs)
	}
	if resp, _ := post("/execute", `{"code":"1","language":"cobol"}`); resp.StatusCode != 400 {
		t.Errorf("unknown language: %d", resp.StatusCode)
	}
	if resp, _ := post("/execute", `{"code":"1","context_id":"nope"}`); resp.StatusCode != 404 {
		t.Errorf("unknown context: %d", resp.StatusCode)
	}
	if resp, _ := post("/execute", `{"code":"1","context_id":"x","language":"bash"}`); resp.StatusCode != 400 {
		t.Errorf("context and language: %d", resp.StatusCode)
	}
	if resp, _ := post("/execute", `{"code":"`+strings.Repeat("a", MaxCodeBytes+1)+`"}`); resp.StatusCode != 413 {
		t.Errorf("big cell: %d", resp.StatusCode)
	}
	resp, evs = post("/contexts", `{"language":"bash","cwd":"/tmp"}`)
	var ctxInfo struct{ ID, Language, Cwd string }
	if resp.StatusCode != 200 || len(evs) != 1 {
		t.Fatalf("create context: %d %v", resp.StatusCode, evs)
	}
	b, _ := json.Marshal(evs[0])
	_ = json.Unmarshal(b, &ctxInfo)
	if ctxInfo.Cwd != "/tmp" || ctxInfo.Language != "bash" {
		t.Errorf("context %+v", ctxInfo)
	}
	_, evs = post("/execute", `{"code":"pwd","context_id":"`+ctxInfo.ID+`"}`)
	if evs[0]["text"] != "/tmp\n" {
		t.Errorf("cwd %v", evs)
	}
	// A client that goes away interrupts the cell; the context still works.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/execute", strings.NewReader(`{"code":"X=5; sleep 30","context_id":"`+ctxInfo.ID+`"}`))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		_, _ = io_ReadAll(resp)
	}
	cancel()
	start := time.Now()
	_, evs = post("/execute", `{"code":"echo $X","context_id":"`+ctxInfo.ID+`"}`)
	if evs[0]["text"] != "5\n" || time.Since(start) > 10*time.Second {
		t.Errorf("after interrupt %v (%s)", evs, time.Since(start))
	}
	dreq, _ := http.NewRequest("DELETE", ts.URL+"/contexts/"+ctxInfo.ID, nil)
	if resp, err := http.DefaultClient.Do(dreq); err != nil || resp.StatusCode != 204 {
		t.Errorf("delete: %v %v", resp, err)
	}
	if resp, _ := post("/contexts/"+ctxInfo.ID+"/restart", ``); resp.StatusCode != 404 {
		t.Errorf("restart deleted: %d", resp.StatusCode)
	}
}

func io_ReadAll(resp *http.Response) ([]byte, error) {
	defer resp.Body.Close()
	var b []byte
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b = append(b, buf[:n]...)
		if err != nil {
			return b, err
		}
	}
}
