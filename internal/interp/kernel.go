package interp

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Event is one NDJSON line of an /execute stream.
type Event map[string]any

func streamEvent(kind, text string) Event {
	return Event{"type": kind, "text": text, "timestamp": time.Now().UTC().Format(time.RFC3339Nano)}
}

func errorEvent(name, value, traceback string) Event {
	return Event{"type": "error", "name": name, "value": value, "traceback": traceback}
}

// Kernel runs cells of one language with state kept between them.
// Execute calls never overlap (a context serializes them).
type Kernel interface {
	// Execute runs code with env set for this execution only, emitting
	// stdout, stderr, result, error and number_of_executions events. It
	// returns when the cell finished, or ErrKernelDied when the kernel
	// died meanwhile.
	Execute(code string, env map[string]string, emit func(Event)) error
	// Interrupt asks the running cell to stop (SIGINT or the like).
	Interrupt() error
	// Dead is closed once the kernel process exited; Status then says how.
	Dead() <-chan struct{}
	Status() string
	// Close kills the kernel.
	Close()
}

// ErrKernelDied is returned by Execute when the kernel died during the cell.
var ErrKernelDied = errors.New("kernel died")

// KernelOptions say how to start a kernel process.
type KernelOptions struct {
	Cwd  string
	Env  []string // the process environment (image env and the like)
	User *User    // nil: nook-interp's own user
	Dir  string   // a private directory the kernel user owns, for its files
}

// User is a sandbox user kernels run as.
type User struct {
	Name     string
	UID, GID uint32
	Home     string
}

// LookupUser finds name in /etc/passwd.
func LookupUser(passwd, name string) (*User, error) {
	f, err := os.Open(passwd)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		p := strings.Split(sc.Text(), ":")
		if len(p) < 7 || p[0] != name {
			continue
		}
		uid, err1 := strconv.ParseUint(p[2], 10, 32)
		gid, err2 := strconv.ParseUint(p[3], 10, 32)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("bad passwd entry for %q", name)
		}
		return &User{Name: name, UID: uint32(uid), GID: uint32(gid), Home: p[5]}, nil
	}
	return nil, fmt.Errorf("no user %q", name)
}

// command makes an exec.Cmd for a kernel process: its own process group
// (so an interrupt or kill reaches what it started), killed when
// nook-interp dies, as o.User, in o.Cwd.
func (o KernelOptions) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	// Find name on the kernel's PATH, not nook-interp's.
	for _, kv := range o.Env {
		if path, ok := strings.CutPrefix(kv, "PATH="); ok {
			for _, dir := range filepath.SplitList(path) {
				p := filepath.Join(dir, name)
				if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
					cmd.Path, cmd.Err = p, nil
					break
				}
			}
		}
	}
	cmd.Dir = o.Cwd
	cmd.Env = o.Env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if o.User != nil && os.Getuid() == 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: o.User.UID, Gid: o.User.GID}
	}
	return cmd
}

// proc tracks a started kernel process.
type proc struct {
	cmd    *exec.Cmd
	dead   chan struct{}
	status string
}

func startProc(cmd *exec.Cmd) (*proc, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, dead: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		if err == nil {
			p.status = "exit status 0"
		} else {
			p.status = strings.TrimPrefix(err.Error(), "exec: ")
		}
		close(p.dead)
	}()
	return p, nil
}

func (p *proc) signal(sig syscall.Signal) error {
	select {
	case <-p.dead:
		return ErrKernelDied
	default:
	}
	return p.cmd.Process.Signal(sig)
}

// kill kills the kernel's whole process group and waits for it.
func (p *proc) kill() {
	if p.cmd.Process != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		_ = p.cmd.Process.Kill()
	}
	select {
	case <-p.dead:
	case <-time.After(5 * time.Second):
	}
}

func (p *proc) Status() string {
	select {
	case <-p.dead:
		return p.status
	default:
		return "running"
	}
}

// envList merges base and overrides into a sorted KEY=VALUE list.
func envList(base []string, over map[string]string) []string {
	m := map[string]string{}
	for _, kv := range base {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			m[k] = v
		}
	}
	for k, v := range over {
		m[k] = v
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
