package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nookhq/nook/internal/rootfs"
	"github.com/nookhq/nook/internal/runtime"
)

// debianRootfs returns the root filesystem dir of the built-in template id,
// building it with mmdebstrap (ownership shifted for the sandboxes' user
// namespace) when it does not exist yet. With a RootfsCache set, a build
// with the same options is taken from the cache as hard links (template
// roots are never written, so sharing inodes is safe) and new builds are
// added to it: many data dirs on one machine build each rootfs once.
func (r *Registry) debianRootfs(ctx context.Context, id string, o rootfs.DebianOptions, progress io.Writer) (string, error) {
	root := filepath.Join(r.dir, id, "rootfs")
	if _, err := os.Stat(root); err == nil {
		return root, nil
	}
	if err := os.MkdirAll(filepath.Dir(root), 0o711); err != nil {
		return "", err
	}
	tmp := filepath.Join(r.dir, ".build-"+id)
	os.RemoveAll(tmp) // a half-made build of an earlier run
	cached := ""
	if r.RootfsCache != "" {
		sum := sha256.Sum256([]byte(fmt.Sprintf("%s|%s|%s|%s|%d", o.Suite, o.Mirror, strings.Join(o.Packages, ","), o.User, rootfs.Recipe)))
		cached = filepath.Join(r.RootfsCache, id+"-"+hex.EncodeToString(sum[:8]))
		if _, err := os.Stat(cached); err == nil {
			fmt.Fprintf(progress, "template %q: root filesystem from cache %s\n", id, cached)
			if err := linkTree(cached, tmp); err != nil {
				return "", err
			}
			return root, os.Rename(tmp, root)
		}
	}
	fmt.Fprintf(progress, "building template %q (Debian %s with %v); this runs once\n", id, o.Suite, o.Packages)
	start := time.Now()
	if err := rootfs.BuildDebian(ctx, tmp, o, progress); err != nil {
		return "", fmt.Errorf("build template %q: %w", id, err)
	}
	if err := rootfs.Shift(tmp, runtime.HostUIDBase); err != nil {
		return "", fmt.Errorf("shift ownership of template %q: %w", id, err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	if cached != "" {
		if err := os.MkdirAll(r.RootfsCache, 0o700); err == nil {
			ctmp := cached + ".tmp"
			os.RemoveAll(ctmp)
			if err := linkTree(tmp, ctmp); err == nil {
				os.Rename(ctmp, cached)
			}
		}
	}
	if err := os.Rename(tmp, root); err != nil {
		return "", err
	}
	fmt.Fprintf(progress, "template %q ready in %s\n", id, time.Since(start).Round(time.Second))
	return root, nil
}

// linkTree copies the tree src to dst (which must not exist) as hard links,
// keeping ownership, modes, xattrs and symlinks.
func linkTree(src, dst string) error {
	if out, err := exec.Command("cp", "-a", "--link", src, dst).CombinedOutput(); err != nil {
		os.RemoveAll(dst)
		return fmt.Errorf("link %s to %s: %v: %s", src, dst, err, strings.TrimSpace(string(out)))
	}
	return nil
}
