package runc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/nookhq/nook/internal/runtime"
)

var _ runtime.Pauser = (*Driver)(nil)

// ErrNoMemoryPause says why runc sandboxes pause without their memory.
var ErrNoMemoryPause = errors.New("runc cannot keep a sandbox's memory on this host (runc checkpoint needs CRIU, and Debian 12's CRIU 3.17 fails on this kernel); use a template with runtime gvisor for memory pauses")

// Pause kills the sandbox's processes, copies its writable layer to
// dir/upper and releases everything else (cgroup, mounts, bundle). runc
// cannot keep memory here, so memory is always false.
func (d *Driver) Pause(ctx context.Context, id, dir string, _ bool) (bool, error) {
	if id == "" || strings.ContainsAny(id, "/.") {
		return false, fmt.Errorf("invalid sandbox id %q", id)
	}
	out, err := exec.CommandContext(ctx, d.Binary, "--root", d.Root, "delete", "--force", id).CombinedOutput()
	if err != nil && !bytes.Contains(out, []byte("does not exist")) && !bytes.Contains(out, []byte("not found")) {
		return false, fmt.Errorf("runc delete %s: %w: %s", id, err, bytes.TrimSpace(out))
	}
	bundle := d.bundle(id)
	// The overlay goes first so that nothing writes the upper dir while it
	// is copied; the tmpfs below it stays until the copy is done.
	if err := unmount(filepath.Join(bundle, "rootfs")); err != nil {
		return false, err
	}
	upper := filepath.Join(bundle, "layer", "upper")
	if _, err := os.Stat(upper); err != nil {
		return false, fmt.Errorf("sandbox %s has no writable layer: %w", id, err)
	}
	if err := copyTree(upper, filepath.Join(dir, runtime.PauseUpper)); err != nil {
		return false, fmt.Errorf("save writable layer: %w", err)
	}
	return false, d.Stop(ctx, id)
}

// Restore is not possible with runc here.
func (d *Driver) Restore(context.Context, runtime.Spec, string) error { return ErrNoMemoryPause }

// Freeze pauses or continues every process of the sandbox (freezer cgroup).
func (d *Driver) Freeze(ctx context.Context, id string, thaw bool) error {
	verb := "pause"
	if thaw {
		verb = "resume"
	}
	out, err := exec.CommandContext(ctx, d.Binary, "--root", d.Root, verb, id).CombinedOutput()
	if err != nil {
		return fmt.Errorf("runc %s %s: %w: %s", verb, id, err, bytes.TrimSpace(out))
	}
	return nil
}

// CopyLayer copies the running sandbox's writable layer to dst while its
// processes are frozen.
func (d *Driver) CopyLayer(ctx context.Context, id, dst string) (err error) {
	if err := d.Freeze(ctx, id, false); err != nil {
		return err
	}
	defer func() {
		if terr := d.Freeze(context.WithoutCancel(ctx), id, true); terr != nil && err == nil {
			err = terr
		}
	}()
	return copyTree(filepath.Join(d.bundle(id), "layer", "upper"), dst)
}

// RootPath is the host path of the sandbox's merged root.
func (d *Driver) RootPath(id string) string { return filepath.Join(d.bundle(id), "rootfs") }

// copyTree copies the directory src to dst (which must not exist) with
// everything overlayfs needs kept: ownership, modes, timestamps, hard links,
// sparse files, device nodes (whiteouts) and all xattrs incl. trusted.*
// (opaque dirs). cp -a does all of it (measured; see README).
func copyTree(src, dst string) error {
	out, err := exec.Command("cp", "-a", "--sparse=auto", "-T", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("cp -a %s %s: %w: %s", src, dst, err, bytes.TrimSpace(out))
	}
	return nil
}

// CopyTree is copyTree for other drivers and the sandbox manager.
func CopyTree(src, dst string) error { return copyTree(src, dst) }

// MountRoot mounts a sandbox root (tmpfs writable layer of size bytes,
// filled from upperFrom when set, under an overlay of layers) in dir, for
// other drivers (gVisor) that run the same bundles.
func MountRoot(dir string, layers []string, size int64, upperFrom string) (string, error) {
	return mountRoot(dir, layers, size, upperFrom)
}

// Unmount detaches every mount at path; not being a mount point is fine.
func Unmount(path string) error { return unmount(path) }

// OCISpec is the OCI config runc sandboxes get, for other drivers.
var OCISpec = ociSpec
