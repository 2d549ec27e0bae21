package runc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/runtime"
)

// RunOnce runs s.Args to completion in a throwaway container for a template
// build step (a Dockerfile RUN): its root is s.Layers under a disk-backed
// writable layer made in scratch/upper (with scratch/work), which is left in
// place holding what the command changed, in overlayfs form (whiteouts,
// opaque dirs), ready to be a layer. The container has the sandboxes'
// isolation (user namespace, seccomp, capabilities, cgroup limits) but the
// host's network, so that steps can fetch packages. user is a name, uid or
// uid:gid, resolved in the image's /etc/passwd. The command's output goes to
// out; RunOnce returns its exit code.
func (d *Driver) RunOnce(ctx context.Context, s runtime.Spec, user, scratch string, out io.Writer) (code int, err error) {
	if s.ID == "" || strings.ContainsAny(s.ID, "/.") {
		return 0, fmt.Errorf("invalid container id %q", s.ID)
	}
	dir := d.bundle(s.ID)
	if err := os.Mkdir(dir, 0o711); err != nil {
		return 0, fmt.Errorf("bundle dir: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
		defer cancel()
		if serr := d.Stop(cctx, s.ID); serr != nil && err == nil {
			err = serr
		}
	}()
	upper, work, empty := filepath.Join(scratch, "upper"), filepath.Join(scratch, "work"), filepath.Join(scratch, "empty")
	for _, p := range []string{upper, work, empty} {
		if err := os.Mkdir(p, 0o755); err != nil {
			return 0, err
		}
		if err := os.Chown(p, runtime.HostUIDBase, runtime.HostUIDBase); err != nil {
			return 0, err
		}
	}
	layers := s.Layers
	if len(layers) == 0 {
		layers = []string{empty} // FROM scratch
	}
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return 0, err
	}
	ovl := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(layers, ":"), upper, work)
	if err := unix.Mount("overlay", rootfs, "overlay", 0, ovl); err != nil {
		return 0, fmt.Errorf("mount build root (%d layers): %w", len(layers), err)
	}
	uid, gid, err := resolveUser(rootfs, user)
	if err != nil {
		return 0, err
	}
	spec, err := ociSpec(s, rootfs, filepath.Join(d.CgroupParent, s.ID))
	if err != nil {
		return 0, err
	}
	spec.Process.User = specs.User{UID: uid, GID: gid}
	// The host's network namespace: sysfs cannot be mounted from a user
	// namespace that does not own it, so bind the host's read-only.
	var ns []specs.LinuxNamespace
	for _, n := range spec.Linux.Namespaces {
		if n.Type != specs.NetworkNamespace {
			ns = append(ns, n)
		}
	}
	spec.Linux.Namespaces = ns
	var mounts []specs.Mount
	for _, m := range spec.Mounts {
		switch m.Destination {
		case "/sys":
			m = specs.Mount{Destination: "/sys", Type: "bind", Source: "/sys", Options: []string{"rbind", "nosuid", "noexec", "nodev", "ro"}}
		case "/sys/fs/cgroup", "/tmp":
			continue // /tmp stays part of the image, as in docker build
		}
		mounts = append(mounts, m)
	}
	for _, f := range []string{"/etc/resolv.conf", "/etc/hosts"} {
		if _, err := os.Stat(f); err == nil {
			mounts = append(mounts, specs.Mount{Destination: f, Type: "bind", Source: f, Options: []string{"rbind", "nosuid", "nodev", "ro"}})
		}
	}
	spec.Mounts = mounts
	// Mount points runc has to create become part of the layer unless
	// removed: note which are missing now.
	var created []string
	for _, m := range spec.Mounts {
		if _, err := os.Lstat(filepath.Join(rootfs, m.Destination)); errors.Is(err, os.ErrNotExist) {
			created = append(created, m.Destination)
		}
	}
	cfg, err := json.Marshal(spec)
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o600); err != nil {
		return 0, err
	}
	errLog := filepath.Join(dir, "runc.log")
	cmd := exec.CommandContext(ctx, d.Binary, "--root", d.Root, "--log", errLog, "--log-format", "json",
		"run", "--bundle", dir, s.ID)
	if out == nil {
		out = io.Discard
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = 5 * time.Second
	runErr := cmd.Run()
	var exitErr *exec.ExitError
	switch {
	case runErr == nil:
	case ctx.Err() != nil:
		return 0, ctx.Err()
	case errors.As(runErr, &exitErr):
		if msg := lastRuncError(errLog); msg != "" {
			return 0, fmt.Errorf("runc run: %s", msg)
		}
		code = exitErr.ExitCode()
	default:
		return 0, fmt.Errorf("runc run: %w", runErr)
	}
	if err := d.Stop(ctx, s.ID); err != nil {
		return 0, err
	}
	// Deepest first, so that /dev goes after /dev/pts.
	sort.Sort(sort.Reverse(sort.StringSlice(created)))
	for _, p := range created {
		q := filepath.Join(upper, p)
		if fi, err := os.Lstat(q); err == nil && (fi.Size() == 0 || fi.IsDir()) {
			os.Remove(q) // fails, as it should, on a dir the command filled
		}
	}
	return code, os.RemoveAll(work)
}

// resolveUser turns "name", "uid", "name:group" or "uid:gid" into ids
// using the root filesystem's /etc/passwd and /etc/group.
func resolveUser(rootfs, user string) (uint32, uint32, error) {
	if user == "" {
		return 0, 0, nil
	}
	u, g, hasGroup := strings.Cut(user, ":")
	uid, pgid, err := lookup(rootfs, "etc/passwd", u)
	if err != nil {
		return 0, 0, err
	}
	gid := pgid
	if hasGroup {
		if gid, _, err = lookup(rootfs, "etc/group", g); err != nil {
			return 0, 0, err
		}
	}
	if uid >= runtime.IDMapSize || gid >= runtime.IDMapSize {
		return 0, 0, fmt.Errorf("user %q is outside the sandbox's id range", user)
	}
	return uid, gid, nil
}

func lookup(rootfs, file, name string) (uint32, uint32, error) {
	if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		return uint32(n), uint32(n), nil
	}
	// Resolve inside the image's root: its symlinks must not reach the host.
	root, err := os.Open(rootfs)
	if err != nil {
		return 0, 0, err
	}
	defer root.Close()
	fd, err := unix.Openat2(int(root.Fd()), file, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT})
	if err != nil {
		return 0, 0, fmt.Errorf("user %q: /%s of the image: %w", name, file, err)
	}
	f := os.NewFile(uintptr(fd), file)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) >= 3 && fields[0] == name {
			id, err := strconv.ParseUint(fields[2], 10, 32)
			if err != nil {
				break
			}
			primary := id
			if len(fields) >= 4 {
				if g, err := strconv.ParseUint(fields[3], 10, 32); err == nil {
					primary = g
				}
			}
			return uint32(id), uint32(primary), nil
		}
	}
	return 0, 0, fmt.Errorf("user %q is not in /%s of the image", name, file)
}
