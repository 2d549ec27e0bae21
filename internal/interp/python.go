package interp

import (
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

//go:embed python_startup.py
var pythonStartup string

// Python is an ipykernel spoken to over the Jupyter wire protocol.
type pythonKernel struct {
	p       *proc
	sign    signer
	session string
	shell   *zsock
	control *zsock
	iopub   *zsock

	mu      sync.Mutex
	waiters map[string]chan *Message // by request msg_id: its replies and iopub messages
}

// StartPython starts `python3 -m ipykernel_launcher` and connects to it.
// matplotlib figures come back inline as PNG without user setup.
func StartPython(o KernelOptions) (Kernel, error) {
	connFile := filepath.Join(o.Dir, "kernel-"+newID()[:12]+".json")
	o.Env = envList(o.Env, map[string]string{
		"MPLBACKEND":                     "module://matplotlib_inline.backend_inline",
		"PYDEVD_DISABLE_FILE_VALIDATION": "1",
	})
	cmd := o.command("python3", "-m", "ipykernel_launcher", "-f", connFile,
		"--HistoryManager.enabled=False", "--InteractiveShell.colors=NoColor", "--IPKernelApp.quiet=True")
	cmd.Stderr = os.Stderr // its banner goes to stdout: dropped
	p, err := startProc(cmd)
	if err != nil {
		return nil, fmt.Errorf("start python kernel: %w", err)
	}
	k := &pythonKernel{p: p, session: newID(), waiters: map[string]chan *Message{}}
	if err := k.connect(connFile); err != nil {
		p.kill()
		return nil, err
	}
	_ = os.Remove(connFile)
	if cellErr, err := k.run(pythonStartup, true, nil); err != nil {
		k.Close()
		return nil, fmt.Errorf("python kernel startup code: %w", err)
	} else if cellErr != nil {
		// Charts and data results are missing, nothing else.
		slog.Warn("python kernel startup code failed", "name", (*cellErr)["name"], "value", (*cellErr)["value"])
	}
	return k, nil
}

// connect waits for the kernel to write its connection file (it picks free
// ports itself, so no port can be taken in between), connects the shell,
// control and iopub sockets, and waits until iopub delivers.
func (k *pythonKernel) connect(connFile string) error {
	deadline := time.Now().Add(60 * time.Second)
	var ci ConnInfo
	for {
		if b, err := os.ReadFile(connFile); err == nil && json.Unmarshal(b, &ci) == nil && ci.ShellPort != 0 {
			break
		}
		select {
		case <-k.p.dead:
			return fmt.Errorf("python kernel exited while starting (%s); is python3-ipykernel installed?", k.p.status)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.New("python kernel did not start within 60 s")
		}
	}
	if ci.SignatureScheme != "" && ci.SignatureScheme != "hmac-sha256" {
		return fmt.Errorf("unsupported signature scheme %q", ci.SignatureScheme)
	}
	k.sign = signer{key: []byte(ci.Key)}
	addr := func(port int) string { return net.JoinHostPort(ci.IP, strconv.Itoa(port)) }
	var err error
	if k.shell, err = dialZMTP(addr(ci.ShellPort), "DEALER", 10*time.Second); err != nil {
		return err
	}
	if k.control, err = dialZMTP(addr(ci.ControlPort), "DEALER", 10*time.Second); err != nil {
		return err
	}
	if k.iopub, err = dialZMTP(addr(ci.IOPubPort), "SUB", 10*time.Second); err != nil {
		return err
	}
	if err := k.iopub.Subscribe(""); err != nil {
		return err
	}
	go k.readLoop(k.shell)
	go k.readLoop(k.control)
	go k.readLoop(k.iopub)
	// The subscription takes effect asynchronously: ask for kernel_info
	// until its status reaches us on iopub.
	for time.Now().Before(deadline) {
		id, ch, err := k.send(k.shell, "kernel_info_request", map[string]any{})
		if err != nil {
			return err
		}
		gotIOPub, gotReply := false, false
		timeout := time.After(200 * time.Millisecond)
	wait:
		for !gotIOPub || !gotReply {
			select {
			case m := <-ch:
				if m.Header.MsgType == "kernel_info_reply" {
					gotReply = true
				} else {
					gotIOPub = true
				}
			case <-k.p.dead:
				k.forget(id)
				return fmt.Errorf("python kernel exited while starting (%s)", k.p.status)
			case <-timeout:
				break wait
			}
		}
		k.forget(id)
		if gotIOPub {
			return nil
		}
	}
	return errors.New("python kernel did not answer within 60 s")
}

func (k *pythonKernel) readLoop(z *zsock) {
	for {
		parts, err := z.Recv()
		if err != nil {
			// The kernel is gone or unusable: make sure it is dead.
			k.p.kill()
			return
		}
		m, err := k.sign.decode(parts)
		if err != nil {
			continue
		}
		k.mu.Lock()
		ch := k.waiters[m.ParentHeader.MsgID]
		k.mu.Unlock()
		if ch != nil {
			ch <- m
		}
	}
}

func (k *pythonKernel) send(z *zsock, msgType string, content any) (string, chan *Message, error) {
	id, parts, err := k.sign.encode(k.session, msgType, content)
	if err != nil {
		return "", nil, err
	}
	ch := make(chan *Message, 1024)
	k.mu.Lock()
	k.waiters[id] = ch
	k.mu.Unlock()
	if err := z.Send(parts); err != nil {
		k.forget(id)
		return "", nil, err
	}
	return id, ch, nil
}

func (k *pythonKernel) forget(id string) {
	k.mu.Lock()
	delete(k.waiters, id)
	k.mu.Unlock()
}

// run executes code and forwards its output to emit (nil: silent, output
// dropped). It returns the error the cell raised, if any.
func (k *pythonKernel) run(code string, silent bool, emit func(Event)) (*Event, error) {
	id, ch, err := k.send(k.shell, "execute_request", map[string]any{
		"code": code, "silent": silent, "store_history": !silent,
		// stop_on_error would make ipykernel abort requests that arrive
		// right after an error (such as the cell queued behind an
		// interrupted one); cells are queued here, one at a time.
		"user_expressions": map[string]any{}, "allow_stdin": false, "stop_on_error": false,
	})
	if err != nil {
		return nil, ErrKernelDied
	}
	defer k.forget(id)
	if emit == nil {
		emit = func(Event) {}
	}
	var cellErr *Event
	idle, replied := false, false
	for !idle || !replied {
		var m *Message
		select {
		case m = <-ch:
		case <-k.p.dead:
			// Deliver what arrived before the death.
			for len(ch) > 0 {
				k.handle(<-ch, emit, &cellErr)
			}
			return cellErr, ErrKernelDied
		}
		switch m.Header.MsgType {
		case "execute_reply":
			replied = true
			var c struct {
				Status         string `json:"status"`
				ExecutionCount *int   `json:"execution_count"`
			}
			_ = json.Unmarshal(m.Content, &c)
			if c.Status == "aborted" && cellErr == nil {
				ev := errorEvent("ExecutionAborted", "the kernel aborted the cell without running it", "")
				cellErr = &ev
				emit(ev)
			}
			if !silent && c.ExecutionCount != nil {
				emit(Event{"type": "number_of_executions", "execution_count": *c.ExecutionCount})
			}
		case "status":
			var c struct {
				State string `json:"execution_state"`
			}
			_ = json.Unmarshal(m.Content, &c)
			if c.State == "idle" {
				idle = true
			}
		default:
			k.handle(m, emit, &cellErr)
		}
	}
	return cellErr, nil
}

// handle turns one iopub message into events.
func (k *pythonKernel) handle(m *Message, emit func(Event), cellErr **Event) {
	switch m.Header.MsgType {
	case "stream":
		var c struct{ Name, Text string }
		if json.Unmarshal(m.Content, &c) == nil {
			kind := "stdout"
			if c.Name == "stderr" {
				kind = "stderr"
			}
			emit(streamEvent(kind, c.Text))
		}
	case "execute_result", "display_data", "update_display_data":
		var c struct {
			Data map[string]json.RawMessage `json:"data"`
		}
		if json.Unmarshal(m.Content, &c) == nil {
			emit(resultEvent(c.Data, m.Header.MsgType == "execute_result"))
		}
	case "error":
		var c struct {
			EName     string   `json:"ename"`
			EValue    string   `json:"evalue"`
			Traceback []string `json:"traceback"`
		}
		if json.Unmarshal(m.Content, &c) == nil {
			ev := errorEvent(c.EName, c.EValue, strings.Join(c.Traceback, "\n"))
			*cellErr = &ev
			emit(ev)
		}
	}
}

// mimeFields maps MIME types to the result fields of the E2B protocol.
var mimeFields = map[string]string{
	"text/plain":                      "text",
	"text/html":                       "html",
	"text/markdown":                   "markdown",
	"image/svg+xml":                   "svg",
	"image/png":                       "png",
	"image/jpeg":                      "jpeg",
	"application/pdf":                 "pdf",
	"text/latex":                      "latex",
	"application/json":                "json",
	"application/javascript":          "javascript",
	"application/vnd.nook.chart+json": "chart",
	"application/vnd.nook.data+json":  "data",
}

func resultEvent(data map[string]json.RawMessage, main bool) Event {
	ev := Event{"type": "result", "is_main_result": main}
	for mime, raw := range data {
		field, ok := mimeFields[mime]
		if !ok {
			field = mime // clients keep unknown keys as extras
		}
		var v any
		if json.Unmarshal(raw, &v) != nil {
			continue
		}
		if s, ok := v.(string); ok && (field == "png" || field == "jpeg") {
			v = strings.TrimSpace(s)
		}
		ev[field] = v
	}
	return ev
}

func (k *pythonKernel) Execute(code string, env map[string]string, emit func(Event)) error {
	if len(env) > 0 {
		b, _ := json.Marshal(env)
		q, _ := json.Marshal(string(b))
		if _, err := k.run("__nook_env_set("+string(q)+")", true, nil); err != nil {
			return err
		}
		defer k.run("__nook_env_restore()", true, nil)
	}
	_, err := k.run(code, false, emit)
	return err
}

func (k *pythonKernel) Interrupt() error { return k.p.signal(syscall.SIGINT) }

func (k *pythonKernel) Dead() <-chan struct{} { return k.p.dead }

func (k *pythonKernel) Status() string { return k.p.Status() }

func (k *pythonKernel) Close() {
	k.p.kill()
	for _, z := range []*zsock{k.shell, k.control, k.iopub} {
		if z != nil {
			z.Close()
		}
	}
}
