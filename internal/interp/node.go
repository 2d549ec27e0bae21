package interp

import (
	"bufio"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

//go:embed node_kernel.js
var nodeKernelJS string

// nodeKernel is nook's JavaScript kernel: a Node process running
// node_kernel.js, spoken to in JSON lines over two pipes.
type nodeKernel struct {
	p    *proc
	req  *os.File
	evs  chan map[string]any
	wmu  sync.Mutex
	done chan struct{} // closed when the event pipe ends
	busy atomic.Bool   // a cell runs
	seq  atomic.Int64  // cells started
}

// StartNode starts the JavaScript kernel (needs `node` on the PATH).
func StartNode(o KernelOptions) (Kernel, error) {
	reqR, reqW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	evR, evW, err := os.Pipe()
	if err != nil {
		reqR.Close()
		reqW.Close()
		return nil, err
	}
	cmd := o.command("node", "--no-warnings", "-e", nodeKernelJS)
	cmd.ExtraFiles = []*os.File{reqR, evW}
	// Output that bypasses process.stdout (native code, child processes).
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = outW, outW
	p, err := startProc(cmd)
	reqR.Close()
	evW.Close()
	outW.Close()
	if err != nil {
		reqW.Close()
		evR.Close()
		outR.Close()
		return nil, fmt.Errorf("start javascript kernel (node): %w", err)
	}
	k := &nodeKernel{p: p, req: reqW, evs: make(chan map[string]any, 256), done: make(chan struct{})}
	go func() {
		defer close(k.done)
		sc := bufio.NewScanner(evR)
		sc.Buffer(make([]byte, 64<<10), 256<<20)
		for sc.Scan() {
			var ev map[string]any
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				k.evs <- ev
			}
		}
		evR.Close()
	}()
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := outR.Read(buf)
			if n > 0 {
				k.evs <- map[string]any{"type": "stdout", "text": string(buf[:n])}
			}
			if err != nil {
				outR.Close()
				return
			}
		}
	}()
	select {
	case ev := <-k.evs:
		if ev["type"] != "ready" {
			k.Close()
			return nil, fmt.Errorf("javascript kernel: unexpected first event %v", ev)
		}
	case <-k.done:
		k.p.kill()
		return nil, fmt.Errorf("javascript kernel exited while starting (%s); is node installed?", k.p.Status())
	case <-time.After(30 * time.Second):
		k.Close()
		return nil, errors.New("javascript kernel did not start within 30 s")
	}
	return k, nil
}

func (k *nodeKernel) Execute(code string, env map[string]string, emit func(Event)) error {
	k.seq.Add(1)
	k.busy.Store(true)
	defer k.busy.Store(false)
	b, _ := json.Marshal(map[string]any{"code": code, "env": env})
	k.wmu.Lock()
	_, err := k.req.Write(append(b, '\n'))
	k.wmu.Unlock()
	if err != nil {
		return ErrKernelDied
	}
	for {
		var ev map[string]any
		select {
		case ev = <-k.evs:
		case <-k.p.dead:
			// Deliver what is left, then report the death.
			for {
				select {
				case ev := <-k.evs:
					k.forward(ev, emit)
				case <-time.After(50 * time.Millisecond):
					return ErrKernelDied
				}
			}
		}
		if ev["type"] == "done" {
			if n, ok := ev["execution_count"].(float64); ok {
				emit(Event{"type": "number_of_executions", "execution_count": int(n)})
			}
			return nil
		}
		k.forward(ev, emit)
	}
}

func (k *nodeKernel) forward(ev map[string]any, emit func(Event)) {
	switch ev["type"] {
	case "stdout", "stderr":
		text, _ := ev["text"].(string)
		emit(streamEvent(ev["type"].(string), text))
	case "result":
		ev["is_main_result"] = true
		emit(Event(ev))
	case "error":
		emit(Event(ev))
	}
}

// Interrupt rejects an awaited promise (SIGUSR2) and, when the cell is
// still running a moment later (a synchronous loop), breaks it with SIGINT.
func (k *nodeKernel) Interrupt() error {
	if err := k.p.signal(syscall.SIGUSR2); err != nil {
		return err
	}
	seq := k.seq.Load()
	go func() {
		time.Sleep(300 * time.Millisecond)
		if k.busy.Load() && k.seq.Load() == seq {
			_ = k.p.signal(syscall.SIGINT)
		}
	}()
	return nil
}

func (k *nodeKernel) Dead() <-chan struct{} { return k.p.dead }

func (k *nodeKernel) Status() string { return k.p.Status() }

func (k *nodeKernel) Close() {
	k.p.kill()
	k.req.Close()
	go func() { // unblock the readers
		for {
			select {
			case <-k.evs:
			case <-time.After(time.Second):
				return
			}
		}
	}()
}
