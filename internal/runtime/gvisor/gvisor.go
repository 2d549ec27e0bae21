// Package gvisor runs sandboxes with gVisor's runsc (systrap platform):
// the same OCI bundles as the runc driver (overlay root on a tmpfs writable
// layer, user namespace, bind mounts), with a user-space kernel in front of
// the host's. Its point is pausing with memory: runsc checkpoint saves every
// process's memory and state to a file and runsc restore continues them.
//
// What runsc needs here (runsc 20240729 from bookworm-backports):
//   - --host-uds=create so the agent's unix socket in the bind-mounted run
//     dir is a host socket nook can connect to;
//   - --overlay2=none so writes go to nook's own overlay (snapshots and
//     backups read it on the host), --network=none (loopback only);
//   - a checkpoint cannot save a bound or connected host socket, so the
//     agent closes its socket on SIGUSR1 before it and listens again on
//     SIGUSR2 after a restore (cmd/nook-agent/checkpoint.go).
package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nookhq/nook/internal/agentwire"
	"github.com/nookhq/nook/internal/runtime"
	"github.com/nookhq/nook/internal/runtime/runc"
)

// Name is the runtime name templates use to pick this driver.
const Name = "gvisor"

// Driver runs sandboxes with runsc.
type Driver struct {
	Binary       string
	Root         string // runsc state
	BundleDir    string
	CgroupParent string
	Log          func(msg string, args ...any)
}

var (
	_ runtime.Runtime = (*Driver)(nil)
	_ runtime.Pauser  = (*Driver)(nil)
)

// New returns a driver keeping its state under dataDir/gvisor, or an error
// when runsc is not installed.
func New(dataDir string) (*Driver, error) {
	bin, err := exec.LookPath("runsc")
	if err != nil {
		return nil, fmt.Errorf("runsc not found in PATH (apt-get install -t bookworm-backports runsc): %w", err)
	}
	base := filepath.Join(dataDir, "gvisor")
	d := &Driver{Binary: bin, Root: filepath.Join(base, "state"), BundleDir: filepath.Join(base, "bundles"), CgroupParent: "/nook"}
	if err := os.MkdirAll(d.Root, 0o700); err != nil {
		return nil, err
	}
	for _, dir := range []string{base, d.BundleDir} {
		if err := os.MkdirAll(dir, 0o711); err != nil {
			return nil, err
		}
		if err := os.Chmod(dir, 0o711); err != nil {
			return nil, err
		}
	}
	return d, nil
}

func (d *Driver) bundle(id string) string { return filepath.Join(d.BundleDir, id) }

func (d *Driver) runsc(args ...string) []string {
	return append([]string{
		"--root", d.Root, "--platform", "systrap", "--network", "none", "--overlay2", "none",
		"--host-uds", "create",
	}, args...)
}

func validID(id string) error {
	if id == "" || strings.ContainsAny(id, "/.") {
		return fmt.Errorf("invalid sandbox id %q", id)
	}
	return nil
}

// Start mounts the root and runs PID 1 under runsc.
func (d *Driver) Start(ctx context.Context, s runtime.Spec) error {
	return d.start(ctx, s, "")
}

// Restore mounts the root (with the saved writable layer) and restores the
// memory saved in dir, then tells the agent to listen again.
func (d *Driver) Restore(ctx context.Context, s runtime.Spec, dir string) error {
	if err := d.start(ctx, s, filepath.Join(dir, "memory")); err != nil {
		return err
	}
	return d.signal(ctx, s.ID, "USR2")
}

func (d *Driver) start(ctx context.Context, s runtime.Spec, image string) (err error) {
	if err := validID(s.ID); err != nil {
		return err
	}
	if len(s.Layers) == 0 || s.Limits.WritableBytes <= 0 {
		return errors.New("no root filesystem layers or writable layer size")
	}
	dir := d.bundle(s.ID)
	if err := os.Mkdir(dir, 0o711); err != nil {
		return fmt.Errorf("bundle dir: %w", err)
	}
	defer func() {
		if err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			_ = d.Stop(cctx, s.ID)
		}
	}()
	rootfs, err := runc.MountRoot(dir, s.Layers, s.Limits.WritableBytes, s.UpperFrom)
	if err != nil {
		return err
	}
	s.NetNSPath, s.UserNSPath = "", "" // runsc's own netstack, loopback only (--network=none)
	spec, err := runc.OCISpec(s, rootfs, filepath.Join(d.CgroupParent, s.ID))
	if err != nil {
		return err
	}
	adapt(spec)
	if err := runc.WriteConfig(dir, spec); err != nil {
		return err
	}
	logf, err := runc.OpenLog(s.LogPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	errLog := filepath.Join(dir, "runsc.log")
	args := []string{"--log", errLog, "--log-format", "json"}
	if image == "" {
		args = append(args, "run", "--detach", "--bundle", dir, s.ID)
	} else {
		args = append(args, "restore", "--detach", "--image-path", image, "--bundle", dir, s.ID)
	}
	cmd := exec.CommandContext(ctx, d.Binary, d.runsc(args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	devnull, _ := os.Open(os.DevNull)
	defer devnull.Close()
	cmd.Stdin = devnull
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("runsc %s: %w: %s", args[4], err, lastError(errLog))
	}
	return nil
}

// adapt drops what runsc does not take from a runc config: the seccomp
// profile (gVisor filters the host syscalls of its own kernel instead) and
// the cgroup-namespace / cgroupfs mount, which it provides itself.
func adapt(spec *specs.Spec) {
	spec.Linux.Seccomp = nil
	var ns []specs.LinuxNamespace
	for _, n := range spec.Linux.Namespaces {
		if n.Type != specs.CgroupNamespace {
			ns = append(ns, n)
		}
	}
	spec.Linux.Namespaces = ns
	if spec.Annotations == nil {
		spec.Annotations = map[string]string{}
	}
}

// lastError returns the last error message runsc logged.
func lastError(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := bytes.Split(bytes.TrimSpace(data), []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		var e struct{ Level, Msg string }
		if json.Unmarshal(lines[i], &e) == nil && (e.Level == "error" || e.Level == "warning") {
			msg := e.Msg
			if len(msg) > 500 {
				msg = msg[:500] + "..."
			}
			return msg
		}
	}
	if n := len(lines); n > 0 {
		return string(lines[n-1])
	}
	return ""
}

func (d *Driver) run(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, d.Binary, d.runsc(args...)...)
	devnull, _ := os.Open(os.DevNull)
	defer devnull.Close()
	cmd.Stdin = devnull
	return cmd.CombinedOutput()
}

func (d *Driver) signal(ctx context.Context, id, sig string) error {
	if out, err := d.run(ctx, "kill", id, sig); err != nil {
		return fmt.Errorf("runsc kill %s %s: %w: %s", id, sig, err, bytes.TrimSpace(out))
	}
	return nil
}

// Stop kills the sandbox, deletes it, unmounts its root, removes its bundle.
func (d *Driver) Stop(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	if d.Holds(id) {
		out, err := d.run(ctx, "delete", "--force", id)
		if err != nil && !bytes.Contains(out, []byte("does not exist")) && !bytes.Contains(out, []byte("not found")) {
			return fmt.Errorf("runsc delete %s: %w: %s", id, err, bytes.TrimSpace(out))
		}
	}
	dir := d.bundle(id)
	for _, m := range []string{filepath.Join(dir, "rootfs"), filepath.Join(dir, "layer")} {
		if err := runc.Unmount(m); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove bundle: %w", err)
	}
	return nil
}

// Holds reports whether this driver has anything of sandbox id.
func (d *Driver) Holds(id string) bool {
	if _, err := os.Stat(d.bundle(id)); err == nil {
		return true
	}
	matches, _ := filepath.Glob(filepath.Join(d.Root, id+"*"))
	return len(matches) > 0
}

// Inspect reports whether the sandbox runs.
func (d *Driver) Inspect(ctx context.Context, id string) (runtime.Info, error) {
	out, err := d.run(ctx, "state", id)
	if err != nil {
		if _, statErr := os.Stat(d.bundle(id)); statErr == nil {
			return runtime.Info{ID: id}, nil
		}
		return runtime.Info{}, fmt.Errorf("%s: %w", id, runtime.ErrNotFound)
	}
	var st struct {
		Status string `json:"status"`
		Pid    int    `json:"pid"`
	}
	if i := bytes.IndexByte(out, '{'); i >= 0 {
		out = out[i:]
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return runtime.Info{}, fmt.Errorf("runsc state %s: %w", id, err)
	}
	return runtime.Info{ID: id, Running: st.Status == "running", Pid: st.Pid}, nil
}

// List returns every sandbox with a bundle.
func (d *Driver) List(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(d.BundleDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// Freeze pauses or continues the sandbox's processes.
func (d *Driver) Freeze(ctx context.Context, id string, thaw bool) error {
	verb := "pause"
	if thaw {
		verb = "resume"
	}
	if out, err := d.run(ctx, verb, id); err != nil {
		return fmt.Errorf("runsc %s %s: %w: %s", verb, id, err, bytes.TrimSpace(out))
	}
	return nil
}

// RootPath is the host path of the sandbox's merged root.
func (d *Driver) RootPath(id string) string { return filepath.Join(d.bundle(id), "rootfs") }

// CopyLayer copies the writable layer while the sandbox is frozen.
func (d *Driver) CopyLayer(ctx context.Context, id, dst string) (err error) {
	if err := d.Freeze(ctx, id, false); err != nil {
		return err
	}
	defer func() {
		if terr := d.Freeze(context.WithoutCancel(ctx), id, true); terr != nil && err == nil {
			err = terr
		}
	}()
	return runc.CopyTree(filepath.Join(d.bundle(id), "layer", "upper"), dst)
}

// agentSocket is the host path of the agent's socket, from the bundle's
// config (the bind mount of agentwire.RunDir).
func (d *Driver) agentSocket(id string) (string, error) {
	data, err := os.ReadFile(filepath.Join(d.bundle(id), "config.json"))
	if err != nil {
		return "", err
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return "", err
	}
	for _, m := range spec.Mounts {
		if m.Destination == agentwire.RunDir {
			return filepath.Join(m.Source, agentwire.SocketName), nil
		}
	}
	return "", errors.New("no agent run dir mount")
}

// Pause checkpoints the sandbox's memory into dir/memory when keepMemory
// is set (falling back to a filesystem-only pause if that fails), saves
// its writable layer to dir/upper and releases the rest.
func (d *Driver) Pause(ctx context.Context, id, dir string, keepMemory bool) (bool, error) {
	if err := validID(id); err != nil {
		return false, err
	}
	memory := false
	if keepMemory {
		if err := d.checkpoint(ctx, id, filepath.Join(dir, "memory")); err != nil {
			d.logf("memory checkpoint failed; pausing the filesystem only", "id", id, "err", err)
			os.RemoveAll(filepath.Join(dir, "memory"))
		} else {
			memory = true
		}
	}
	if !memory {
		if out, err := d.run(ctx, "delete", "--force", id); err != nil && !bytes.Contains(out, []byte("does not exist")) {
			return false, fmt.Errorf("runsc delete %s: %w: %s", id, err, bytes.TrimSpace(out))
		}
	}
	bundle := d.bundle(id)
	if err := runc.Unmount(filepath.Join(bundle, "rootfs")); err != nil {
		return false, err
	}
	if err := runc.CopyTree(filepath.Join(bundle, "layer", "upper"), filepath.Join(dir, runtime.PauseUpper)); err != nil {
		return false, fmt.Errorf("save writable layer: %w", err)
	}
	return memory, d.Stop(ctx, id)
}

// checkpoint has the agent close its host socket, then saves the
// sandbox's memory with runsc checkpoint (which ends the sandbox). If the
// checkpoint fails while the sandbox still runs, the agent listens again.
func (d *Driver) checkpoint(ctx context.Context, id, image string) error {
	sock, err := d.agentSocket(id)
	if err != nil {
		return err
	}
	if err := d.signal(ctx, id, "USR1"); err != nil {
		return err
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Lstat(sock); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			d.signal(ctx, id, "USR2")
			return errors.New("the agent did not close its socket for the checkpoint")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := os.MkdirAll(image, 0o700); err != nil {
		return err
	}
	out, err := d.run(ctx, "checkpoint", "--image-path", image, id)
	if err != nil {
		if info, ierr := d.Inspect(ctx, id); ierr == nil && info.Running {
			d.signal(ctx, id, "USR2")
		}
		msg := string(bytes.TrimSpace(out))
		if i := strings.Index(msg, "\n"); i > 0 {
			msg = msg[:i]
		}
		return fmt.Errorf("runsc checkpoint: %w: %s", err, msg)
	}
	return nil
}

func (d *Driver) logf(msg string, args ...any) {
	if d.Log != nil {
		d.Log(msg, args...)
	}
}
