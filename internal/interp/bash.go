package interp

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// bashKernel is a persistent bash process: each cell is written to a file
// and sourced in the same shell, so variables, functions, the working
// directory and exported names persist. The end of a cell is a marker
// printed on stdout (with the cell's exit status) and on stderr.
type bashKernel struct {
	p    *proc
	o    KernelOptions
	in   *os.File
	wmu  sync.Mutex
	out  chan chunk
	seq  int
	file string
}

type chunk struct {
	stderr bool
	data   []byte
	eof    bool
}

// bashPrelude is read by the shell once. A SIGINT returns from the sourced
// cell (and the shell survives it).
const bashPrelude = `__nook_cell() {
  trap 'return 130' INT
  . "$1"
  local __nook_rc=$?
  trap - INT
  return $__nook_rc
}
`

// StartBash starts the Bash kernel.
func StartBash(o KernelOptions) (Kernel, error) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := o.command("bash", "--norc", "--noprofile")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	p, err := startProc(cmd)
	inR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		errR.Close()
		return nil, fmt.Errorf("start bash kernel: %w", err)
	}
	k := &bashKernel{p: p, o: o, in: inW, out: make(chan chunk, 256), file: filepath.Join(o.Dir, "cell-"+newID()[:12]+".sh")}
	for _, r := range []struct {
		f      *os.File
		stderr bool
	}{{outR, false}, {errR, true}} {
		go func(f *os.File, stderr bool) {
			buf := make([]byte, 32<<10)
			for {
				n, err := f.Read(buf)
				if n > 0 {
					k.out <- chunk{stderr: stderr, data: append([]byte(nil), buf[:n]...)}
				}
				if err != nil {
					f.Close()
					k.out <- chunk{stderr: stderr, eof: true}
					return
				}
			}
		}(r.f, r.stderr)
	}
	if _, err := inW.WriteString(bashPrelude); err != nil {
		k.Close()
		return nil, ErrKernelDied
	}
	// Make sure the shell is up before the first cell.
	if err := k.Execute("", nil, func(Event) {}); err != nil {
		k.Close()
		return nil, fmt.Errorf("bash kernel did not start (%s)", p.Status())
	}
	return k, nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func (k *bashKernel) Execute(code string, env map[string]string, emit func(Event)) error {
	if code != "" {
		k.seq++
	}
	marker := "__NOOK_END_" + newID()[:16] + "__"
	var script bytes.Buffer
	keys := sortedKeys(env)
	for i, name := range keys {
		if !validShellName(name) {
			continue
		}
		fmt.Fprintf(&script, "__nook_set_%d=${%s+x}; __nook_old_%d=${%s-}; export %s=%s\n", i, name, i, name, name, shellQuote(env[name]))
	}
	cell := k.file
	if err := os.WriteFile(cell, []byte(code), 0o600); err != nil {
		return fmt.Errorf("write cell: %w", err)
	}
	if k.o.User != nil && os.Getuid() == 0 {
		_ = os.Chown(cell, int(k.o.User.UID), int(k.o.User.GID))
	}
	fmt.Fprintf(&script, "__nook_cell %s\n__nook_rc=$?\n", shellQuote(cell))
	for i, name := range keys {
		if !validShellName(name) {
			continue
		}
		fmt.Fprintf(&script, "if [ -n \"$__nook_set_%d\" ]; then export %s=\"$__nook_old_%d\"; else unset %s; fi; unset __nook_set_%d __nook_old_%d\n", i, name, i, name, i, i)
	}
	fmt.Fprintf(&script, "printf '%%s %%d\\n' %s \"$__nook_rc\"; printf '%%s\\n' %s >&2\n", marker, marker)
	k.wmu.Lock()
	_, err := k.in.Write(script.Bytes())
	k.wmu.Unlock()
	if err != nil {
		return ErrKernelDied
	}
	var tail [2][]byte
	doneOut, doneErr := false, false
	rc := 0
	for !doneOut || !doneErr {
		var c chunk
		select {
		case c = <-k.out:
		case <-k.p.dead:
			// Deliver what is left, then report the death.
			for {
				select {
				case c := <-k.out:
					if !c.eof {
						emit(streamEvent(kind(c.stderr), string(c.data)))
					}
				case <-time.After(50 * time.Millisecond):
					return ErrKernelDied
				}
			}
		}
		if c.eof {
			continue
		}
		i := 0
		if c.stderr {
			i = 1
		}
		if (i == 0 && doneOut) || (i == 1 && doneErr) {
			continue
		}
		buf := append(tail[i], c.data...)
		if at := bytes.Index(buf, []byte(marker)); at >= 0 {
			if at > 0 {
				emit(streamEvent(kind(c.stderr), string(buf[:at])))
			}
			rest := buf[at+len(marker):]
			if i == 0 {
				doneOut = true
				line, _, _ := bytes.Cut(rest, []byte("\n"))
				rc, _ = strconv.Atoi(strings.TrimSpace(string(line)))
			} else {
				doneErr = true
			}
			tail[i] = nil
			continue
		}
		// Hold back a possible start of the marker.
		keep := 0
		for n := len(marker) - 1; n > 0; n-- {
			if n <= len(buf) && bytes.HasSuffix(buf, []byte(marker[:n])) {
				keep = n
				break
			}
		}
		if len(buf)-keep > 0 {
			emit(streamEvent(kind(c.stderr), string(buf[:len(buf)-keep])))
		}
		tail[i] = append([]byte(nil), buf[len(buf)-keep:]...)
	}
	if code != "" {
		emit(Event{"type": "number_of_executions", "execution_count": k.seq})
	}
	if rc != 0 {
		emit(errorEvent("ExitCodeError", strconv.Itoa(rc), fmt.Sprintf("the cell exited with status %d", rc)))
	}
	return nil
}

func kind(stderr bool) string {
	if stderr {
		return "stderr"
	}
	return "stdout"
}

func validShellName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

func (k *bashKernel) Interrupt() error {
	// The cell's foreground jobs and the shell (which returns from the cell).
	select {
	case <-k.p.dead:
		return ErrKernelDied
	default:
	}
	return syscall.Kill(-k.p.cmd.Process.Pid, syscall.SIGINT)
}

func (k *bashKernel) Dead() <-chan struct{} { return k.p.dead }

func (k *bashKernel) Status() string { return k.p.Status() }

func (k *bashKernel) Close() {
	k.p.kill()
	k.in.Close()
	os.Remove(k.file)
}
