package runc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"

	"github.com/nookhq/nook/internal/runtime"
)

var _ runtime.Execer = (*Driver)(nil)

// Exec starts spec inside the running sandbox id with `runc exec`, which
// enters the sandbox's namespaces and cgroup and starts from PID 1's
// process settings (image environment, capabilities, no_new_privs, seccomp).
// With TTY, runc runs on a pseudo-terminal of nook's: runc makes the
// sandbox-side terminal, puts nook's into raw mode and copies between them,
// and follows its window size (SIGWINCH), so Resize sets nook's side.
func (d *Driver) Exec(ctx context.Context, id string, spec runtime.ExecSpec, withStdin bool) (runtime.ExecProcess, error) {
	if id == "" || strings.ContainsAny(id, "/.") {
		return nil, fmt.Errorf("invalid sandbox id %q", id)
	}
	if len(spec.Args) == 0 || spec.Args[0] == "" {
		return nil, errors.New("exec: a command is required")
	}
	info, err := d.Inspect(ctx, id)
	if err != nil {
		return nil, err
	}
	if !info.Running {
		return nil, fmt.Errorf("sandbox %s is not running: %w", id, runtime.ErrNotFound)
	}
	user, err := d.resolveUser(id, spec.User)
	if err != nil {
		return nil, err
	}
	cwd := spec.Cwd
	if cwd == "" {
		cwd = "/"
	}
	args := []string{"--root", d.Root, "exec", "--cwd", cwd, "--user", user}
	if spec.TTY {
		args = append(args, "--tty")
	}
	for _, e := range spec.Env {
		args = append(args, "--env", e)
	}
	argv := spec.Args
	if _, err := os.Stat(filepath.Join(d.bundle(id), compiledMarker)); err == nil {
		argv = seccompWrapped(argv) // the sandbox's filter is not runc's
	}
	args = append(append(args, id), argv...)
	// Not CommandContext: the caller ends the process with Kill.
	cmd := exec.Command(d.Binary, args...)
	p := &execProc{cmd: cmd, done: make(chan struct{})}
	if spec.TTY {
		cols, rows := spec.Cols, spec.Rows
		if cols == 0 || rows == 0 {
			cols, rows = 80, 24
		}
		master, err := pty.StartWithSize(cmd, &pty.Winsize{Cols: cols, Rows: rows})
		if err != nil {
			return nil, fmt.Errorf("runc exec: %w", err)
		}
		p.master = master
		p.stdout = master
		if withStdin {
			p.stdin = nopCloseWriter{master}
		}
	} else {
		if withStdin {
			w, err := cmd.StdinPipe()
			if err != nil {
				return nil, err
			}
			p.stdin = w
		}
		or, ow, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		er, ew, err := os.Pipe()
		if err != nil {
			or.Close()
			ow.Close()
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = ow, ew
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		err = cmd.Start()
		ow.Close()
		ew.Close()
		if err != nil {
			or.Close()
			er.Close()
			return nil, fmt.Errorf("runc exec: %w", err)
		}
		p.stdout, p.stderr = or, er
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

type nopCloseWriter struct{ io.Writer }

func (nopCloseWriter) Close() error { return nil }

type execProc struct {
	cmd    *exec.Cmd
	master *os.File
	stdin  io.WriteCloser
	stdout io.Reader
	stderr io.Reader
	done   chan struct{}
	err    error
	once   sync.Once
}

func (p *execProc) Stdin() io.WriteCloser { return p.stdin }
func (p *execProc) Stdout() io.Reader     { return p.stdout }
func (p *execProc) Stderr() io.Reader     { return p.stderr }

func (p *execProc) Resize(cols, rows uint16) error {
	if p.master == nil {
		return errors.New("exec has no terminal")
	}
	if cols == 0 || rows == 0 {
		return errors.New("cols and rows must be positive")
	}
	return pty.Setsize(p.master, &pty.Winsize{Cols: cols, Rows: rows})
}

// Wait returns the exit code runc passes through (the process's own, or
// 128+signal when a signal ended it).
func (p *execProc) Wait() (int, error) {
	<-p.done
	// Background children may hold the output pipes: stop reading soon.
	for _, r := range []io.Reader{p.stdout, p.stderr} {
		if f, ok := r.(*os.File); ok && f != p.master {
			_ = f.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		}
	}
	if p.master != nil {
		// Output readers see EIO once runc (the only slave holder) is gone.
		defer p.once.Do(func() { time.AfterFunc(time.Second, func() { p.master.Close() }) })
	}
	if p.err == nil {
		return 0, nil
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
		return ee.ExitCode(), nil
	}
	return -1, p.err
}

// Kill hangs up the exec (runc forwards the signal into the sandbox), then
// kills runc a second later if it is still there.
func (p *execProc) Kill() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGHUP)
	go func() {
		select {
		case <-p.done:
		case <-time.After(time.Second):
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
		}
	}()
	return nil
}

// resolveUser turns a user name, uid or uid:gid into runc's uid:gid using
// the sandbox's own /etc/passwd (seen through its mounted root).
func (d *Driver) resolveUser(id, user string) (string, error) {
	if user == "" {
		return "0:0", nil
	}
	name, group, hasGroup := strings.Cut(user, ":")
	if _, err := strconv.ParseUint(name, 10, 32); err == nil {
		if hasGroup {
			if _, err := strconv.ParseUint(group, 10, 32); err != nil {
				return "", fmt.Errorf("user %q: group must be numeric", user)
			}
			return user, nil
		}
		// A bare uid: its primary group when passwd knows it, else the uid.
		if _, gid, ok := lookupPasswd(filepath.Join(d.bundle(id), "rootfs", "etc", "passwd"), name, true); ok {
			return name + ":" + gid, nil
		}
		return name + ":" + name, nil
	}
	uid, gid, ok := lookupPasswd(filepath.Join(d.bundle(id), "rootfs", "etc", "passwd"), name, false)
	if !ok {
		return "", fmt.Errorf("user %q not found in the sandbox's /etc/passwd", name)
	}
	if hasGroup {
		gid = group
	}
	return uid + ":" + gid, nil
}

// lookupPasswd finds a user by name (or by uid when byUID) in a passwd file.
func lookupPasswd(path, key string, byUID bool) (uid, gid string, ok bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", "", false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) < 4 {
			continue
		}
		if (!byUID && fields[0] == key) || (byUID && fields[2] == key) {
			return fields[2], fields[3], true
		}
	}
	return "", "", false
}
