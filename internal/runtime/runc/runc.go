// Package runc runs sandboxes with the runc binary: each sandbox is an OCI
// bundle whose root is an overlayfs of the template's read-only layers under a
// size-limited tmpfs writable layer.
package runc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/runtime"
)

// Driver runs sandboxes through the runc binary.
type Driver struct {
	// Binary is the runc executable (default "runc" from PATH).
	Binary string
	// Root is runc's own state directory.
	Root string
	// BundleDir holds one directory per sandbox: the writable layer mount,
	// the overlay root mount and config.json.
	BundleDir string
	// CgroupParent is the cgroup path under which sandboxes' cgroups are made.
	CgroupParent string
	// SeccompFilter is the host path of the sandboxes' seccomp filter as
	// compiled by nook (internal/seccomp); empty lets runc compile the
	// profile at every start. See compiledSeccomp in spec.go.
	SeccompFilter string
}

var _ runtime.Runtime = (*Driver)(nil)

// New returns a driver keeping its state under dataDir.
func New(dataDir string) (*Driver, error) {
	bin, err := exec.LookPath("runc")
	if err != nil {
		return nil, fmt.Errorf("runc not found in PATH (install the runc package): %w", err)
	}
	d := &Driver{
		Binary:       bin,
		Root:         filepath.Join(dataDir, "runc"),
		BundleDir:    filepath.Join(dataDir, "bundles"),
		CgroupParent: "/nook",
	}
	if err := os.MkdirAll(d.Root, 0o700); err != nil {
		return nil, err
	}
	// The bundle dir and its parents must be traversable by the sandboxes'
	// root (a shifted uid) so that runc can reach the root filesystem from
	// inside the user namespace.
	for _, dir := range []string{dataDir, d.BundleDir} {
		if err := os.MkdirAll(dir, 0o711); err != nil {
			return nil, err
		}
		if err := os.Chmod(dir, 0o711); err != nil {
			return nil, err
		}
	}
	filter, err := writeSeccompFilter(filepath.Join(dataDir, "seccomp.bpf"))
	if err != nil {
		return nil, err
	}
	d.SeccompFilter = filter
	return d, nil
}

func (d *Driver) bundle(id string) string { return filepath.Join(d.BundleDir, id) }

// Start mounts the sandbox's root filesystem and starts PID 1 with runc.
func (d *Driver) Start(ctx context.Context, s runtime.Spec) (err error) {
	if s.ID == "" || strings.ContainsAny(s.ID, "/.") {
		return fmt.Errorf("invalid sandbox id %q", s.ID)
	}
	if len(s.Layers) == 0 {
		return errors.New("no root filesystem layers")
	}
	if s.Limits.WritableBytes <= 0 {
		return errors.New("writable layer size must be positive")
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
	rootfs, err := mountRoot(dir, s.Layers, s.Limits.WritableBytes, s.UpperFrom)
	if err != nil {
		return err
	}
	spec, err := ociSpec(s, rootfs, filepath.Join(d.CgroupParent, s.ID))
	if err != nil {
		return err
	}
	if d.SeccompFilter != "" {
		if err := useCompiledSeccomp(dir, spec, d.SeccompFilter); err != nil {
			return err
		}
	}
	if err := WriteConfig(dir, spec); err != nil {
		return err
	}
	logf, err := OpenLog(s.LogPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	errLog := filepath.Join(dir, "runc.log")
	cmd := exec.CommandContext(ctx, d.Binary, "--root", d.Root, "--log", errLog, "--log-format", "json",
		// No session keyring per sandbox: Docker's seccomp profile denies
		// the keyring syscalls anyway, and one keyring per sandbox (all of
		// one host uid) exhausts the kernel's per-user key quota at about
		// 180 sandboxes.
		"run", "--detach", "--no-new-keyring", "--preserve-fds", strconv.Itoa(len(s.ExtraFiles)), "--bundle", dir, s.ID)
	cmd.ExtraFiles = s.ExtraFiles
	// PID 1 inherits these files; they must be real files, not pipes that
	// os/exec would wait on.
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("runc run: %w: %s", err, lastRuncError(errLog))
	}
	return nil
}

// WriteConfig writes spec as the bundle's config.json in dir.
func WriteConfig(dir string, spec *specs.Spec) error {
	cfg, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o600)
}

// OpenLog opens the file that receives PID 1's output (/dev/null when path
// is empty) for appending, never through a symlink.
func OpenLog(path string) (*os.File, error) {
	if path == "" {
		path = os.DevNull
	}
	return os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
}

// mountRoot mounts a tmpfs writable layer of size bytes and the overlay root
// above it inside dir, and returns the root's path. A non-empty upperFrom is
// copied in as the writable layer's contents (see pause.go).
func mountRoot(dir string, layers []string, size int64, upperFrom string) (string, error) {
	layer := filepath.Join(dir, "layer")
	rootfs := filepath.Join(dir, "rootfs")
	for _, p := range []string{layer, rootfs} {
		if err := os.Mkdir(p, 0o755); err != nil {
			return "", err
		}
	}
	opts := fmt.Sprintf("size=%d,mode=0755,uid=%d,gid=%d", size, runtime.HostUIDBase, runtime.HostUIDBase)
	if err := unix.Mount("tmpfs", layer, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return "", fmt.Errorf("mount writable layer: %w", err)
	}
	upper, work := filepath.Join(layer, "upper"), filepath.Join(layer, "work")
	if upperFrom != "" {
		if err := copyTree(upperFrom, upper); err != nil {
			return "", fmt.Errorf("restore writable layer: %w", err)
		}
	}
	for _, p := range []string{upper, work} {
		if p == upper && upperFrom != "" {
			continue
		}
		if err := os.Mkdir(p, 0o755); err != nil {
			return "", err
		}
		if err := os.Chown(p, runtime.HostUIDBase, runtime.HostUIDBase); err != nil {
			return "", err
		}
	}
	ovl := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(layers, ":"), upper, work)
	if err := unix.Mount("overlay", rootfs, "overlay", 0, ovl); err != nil {
		return "", fmt.Errorf("mount overlay root: %w", err)
	}
	return rootfs, nil
}

// lastRuncError returns the last error message runc logged.
func lastRuncError(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := bytes.Split(bytes.TrimSpace(data), []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		var entry struct{ Level, Msg string }
		if json.Unmarshal(lines[i], &entry) == nil && entry.Level == "error" {
			return entry.Msg
		}
	}
	return ""
}

// Stop kills the sandbox, deletes its container and cgroup, unmounts its root
// and removes its bundle. It is safe on half-made or unknown sandboxes.
func (d *Driver) Stop(ctx context.Context, id string) error {
	if id == "" || strings.ContainsAny(id, "/.") {
		return fmt.Errorf("invalid sandbox id %q", id)
	}
	// delete --force kills every process of the container and removes its
	// cgroup; an unknown container is not an error here. A running
	// container is killed first: delete --force of a running one polls
	// for its end in 100 ms steps.
	d.killInit(id)
	out, err := exec.CommandContext(ctx, d.Binary, "--root", d.Root, "delete", "--force", id).CombinedOutput()
	if err != nil && !bytes.Contains(out, []byte("does not exist")) && !bytes.Contains(out, []byte("not found")) {
		return fmt.Errorf("runc delete %s: %w: %s", id, err, bytes.TrimSpace(out))
	}
	dir := d.bundle(id)
	for _, m := range []string{filepath.Join(dir, "rootfs"), filepath.Join(dir, "layer")} {
		if err := unmount(m); err != nil {
			return err
		}
	}
	// Only remove the bundle once nothing is mounted in it: removing through
	// a live overlay would reach the template's files.
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove bundle: %w", err)
	}
	return nil
}

// killInit sends SIGKILL to the sandbox's PID 1 (which ends every
// process of its PID namespace) and waits up to 250 ms for it to end (a
// frozen sandbox does not end until runc delete thaws it).
// PID 1 is found from runc's state and held through a pidfd whose start
// time is checked, so a recycled pid is never signalled. Failures are
// left to runc delete.
func (d *Driver) killInit(id string) {
	data, err := os.ReadFile(filepath.Join(d.Root, id, "state.json"))
	if err != nil {
		return
	}
	var st struct {
		Pid   int    `json:"init_process_pid"`
		Start uint64 `json:"init_process_start"`
	}
	if json.Unmarshal(data, &st) != nil || st.Pid <= 0 {
		return
	}
	fd, err := unix.PidfdOpen(st.Pid, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	if start, err := processStart(st.Pid); err != nil || start != st.Start {
		return // not that process any more
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil {
		return
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	unix.Poll(fds, 250) // readable once the process has ended
}

// processStart is the start time (field 22 of /proc/PID/stat, in clock
// ticks since boot) of process pid.
func processStart(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: count from its end.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// unmount detaches the mount at path if there is one.
func unmount(path string) error {
	for i := 0; i < 10; i++ {
		err := unix.Unmount(path, unix.MNT_DETACH)
		if err == nil {
			continue // there may be stacked mounts
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil // not a mount point (any more)
		}
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	return fmt.Errorf("unmount %s: still mounted", path)
}

// Inspect reports whether the sandbox's PID 1 is running.
func (d *Driver) Inspect(ctx context.Context, id string) (runtime.Info, error) {
	out, err := exec.CommandContext(ctx, d.Binary, "--root", d.Root, "state", id).Output()
	if err != nil {
		if _, statErr := os.Stat(d.bundle(id)); statErr == nil {
			return runtime.Info{ID: id}, nil // resources left, not running
		}
		return runtime.Info{}, fmt.Errorf("%s: %w", id, runtime.ErrNotFound)
	}
	var st struct {
		Status string `json:"status"`
		Pid    int    `json:"pid"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return runtime.Info{}, fmt.Errorf("runc state %s: %w", id, err)
	}
	return runtime.Info{ID: id, Running: st.Status == "running", Pid: st.Pid}, nil
}

// List returns every sandbox with a bundle or a runc container.
func (d *Driver) List(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	var ids []string
	for _, dir := range []string{d.BundleDir, d.Root} {
		entries, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		for _, e := range entries {
			if e.IsDir() && !seen[e.Name()] {
				seen[e.Name()] = true
				ids = append(ids, e.Name())
			}
		}
	}
	return ids, nil
}
