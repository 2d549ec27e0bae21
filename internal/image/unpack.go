package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/runtime"
)

// OCI whiteout names (image-spec layer.md).
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
	// OpaqueXattr marks an overlayfs directory whose lower contents are hidden.
	OpaqueXattr = "trusted.overlay.opaque"
)

// ErrHostile marks a layer entry nook refuses to unpack (it escapes the
// layer's root or is a device node).
var ErrHostile = errors.New("layer refused")

// Unpack extracts an uncompressed layer tar stream into dest (which must not
// exist) as an overlayfs lower layer: OCI whiteouts become overlayfs whiteouts
// (char device 0/0, opaque dirs get trusted.overlay.opaque=y), and every
// owner is shifted by runtime.HostUIDBase. Entries that escape the root
// (absolute paths, "..", writes through symlinks) and device nodes are
// refused with an error wrapping ErrHostile. On any error dest is removed.
func Unpack(r io.Reader, dest string) (err error) {
	if err := os.Mkdir(dest, 0o755); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dest)
		}
	}()
	base := runtime.HostUIDBase
	if err := os.Lchown(dest, base, base); err != nil {
		return err
	}
	u := &unpacker{root: dest, base: base}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read layer: %w", err)
		}
		if err := u.entry(hdr, tr); err != nil {
			return fmt.Errorf("layer entry %q: %w", hdr.Name, err)
		}
	}
	// Directory times last: creating entries inside changed them.
	for i := len(u.dirTimes) - 1; i >= 0; i-- {
		d := u.dirTimes[i]
		ts := []unix.Timespec{unix.NsecToTimespec(d.mtime.UnixNano()), unix.NsecToTimespec(d.mtime.UnixNano())}
		_ = unix.UtimesNanoAt(unix.AT_FDCWD, d.path, ts, unix.AT_SYMLINK_NOFOLLOW)
	}
	return nil
}

type dirTime struct {
	path  string
	mtime time.Time
}

type unpacker struct {
	root     string
	base     int
	dirTimes []dirTime
}

// clean validates a layer path and returns it relative and cleaned ("." for
// the root).
func clean(name string) (string, error) {
	if strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("NUL in path: %w", ErrHostile)
	}
	if path.IsAbs(name) {
		return "", fmt.Errorf("absolute path: %w", ErrHostile)
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", fmt.Errorf("path with \"..\" escapes the root: %w", ErrHostile)
		}
	}
	return path.Clean(name), nil
}

// parent makes sure every directory above rel exists inside the root as a
// real directory (never a symlink) and returns the host path of rel.
func (u *unpacker) parent(rel string) (string, error) {
	dir := u.root
	parts := strings.Split(rel, "/")
	for _, c := range parts[:len(parts)-1] {
		dir = filepath.Join(dir, c)
		fi, err := os.Lstat(dir)
		switch {
		case errors.Is(err, os.ErrNotExist):
			if err := os.Mkdir(dir, 0o755); err != nil {
				return "", err
			}
			if err := os.Lchown(dir, u.base, u.base); err != nil {
				return "", err
			}
		case err != nil:
			return "", err
		case fi.Mode()&os.ModeSymlink != 0:
			return "", fmt.Errorf("path goes through the symlink %q: %w", strings.TrimPrefix(dir, u.root+"/"), ErrHostile)
		case !fi.IsDir():
			return "", fmt.Errorf("%q is not a directory", strings.TrimPrefix(dir, u.root+"/"))
		}
	}
	return filepath.Join(u.root, rel), nil
}

// ids returns the shifted owner of hdr.
func (u *unpacker) ids(hdr *tar.Header) (int, int, error) {
	if hdr.Uid < 0 || hdr.Uid >= runtime.IDMapSize || hdr.Gid < 0 || hdr.Gid >= runtime.IDMapSize {
		return 0, 0, fmt.Errorf("owner %d:%d is outside the sandbox's id range 0-%d", hdr.Uid, hdr.Gid, runtime.IDMapSize-1)
	}
	return hdr.Uid + u.base, hdr.Gid + u.base, nil
}

// clear removes whatever is at p unless both it and the new entry are
// directories.
func clear(p string, newIsDir bool) error {
	fi, err := os.Lstat(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() && newIsDir {
		return nil
	}
	return os.RemoveAll(p)
}

func (u *unpacker) entry(hdr *tar.Header, r io.Reader) error {
	rel, err := clean(hdr.Name)
	if err != nil {
		return err
	}
	bname := path.Base(rel)
	if rel != "." && strings.HasPrefix(bname, whiteoutPrefix) {
		return u.whiteout(rel, bname)
	}
	if rel == "." {
		if hdr.Typeflag != tar.TypeDir {
			return fmt.Errorf("the layer root must be a directory: %w", ErrHostile)
		}
		return u.attrs(u.root, hdr, true)
	}
	p, err := u.parent(rel)
	if err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := clear(p, true); err != nil {
			return err
		}
		if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		if err := u.attrs(p, hdr, true); err != nil {
			return err
		}
		u.dirTimes = append(u.dirTimes, dirTime{p, hdr.ModTime})
		return nil
	case tar.TypeReg, tar.TypeRegA:
		if err := clear(p, false); err != nil {
			return err
		}
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, r)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		return u.attrs(p, hdr, false)
	case tar.TypeSymlink:
		if err := clear(p, false); err != nil {
			return err
		}
		if err := os.Symlink(hdr.Linkname, p); err != nil {
			return err
		}
		return u.attrs(p, hdr, false)
	case tar.TypeLink:
		trel, err := clean(hdr.Linkname)
		if err != nil || trel == "." {
			return fmt.Errorf("hard link target %q escapes the root: %w", hdr.Linkname, ErrHostile)
		}
		target, err := u.parent(trel)
		if err != nil {
			return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
		}
		fi, err := os.Lstat(target)
		if err != nil {
			return fmt.Errorf("hard link target %q is not in this layer: %w", hdr.Linkname, err)
		}
		if fi.IsDir() {
			return fmt.Errorf("hard link to the directory %q: %w", hdr.Linkname, ErrHostile)
		}
		if err := clear(p, false); err != nil {
			return err
		}
		return os.Link(target, p)
	case tar.TypeFifo:
		if err := clear(p, false); err != nil {
			return err
		}
		if err := unix.Mkfifo(p, 0o600); err != nil {
			return err
		}
		return u.attrs(p, hdr, false)
	case tar.TypeChar, tar.TypeBlock:
		return fmt.Errorf("device node (%d:%d): %w", hdr.Devmajor, hdr.Devminor, ErrHostile)
	case tar.TypeXGlobalHeader, tar.TypeXHeader, tar.TypeGNULongName, tar.TypeGNULongLink:
		return nil
	default:
		return fmt.Errorf("unsupported tar entry type %q", hdr.Typeflag)
	}
}

// whiteout turns an OCI whiteout into its overlayfs form.
func (u *unpacker) whiteout(rel, bname string) error {
	dir := path.Dir(rel)
	switch {
	case bname == whiteoutOpaque:
		p, err := u.parent(path.Join(dir, "x"))
		if err != nil {
			return err
		}
		d := filepath.Dir(p)
		if dir == "." {
			d = u.root
		}
		return unix.Lsetxattr(d, OpaqueXattr, []byte("y"), 0)
	case strings.HasPrefix(bname, whiteoutMeta):
		return nil // aufs metadata (hard link dirs): not needed
	}
	name := strings.TrimPrefix(bname, whiteoutPrefix)
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("malformed whiteout: %w", ErrHostile)
	}
	p, err := u.parent(path.Join(dir, name))
	if err != nil {
		return err
	}
	if err := clear(p, false); err != nil {
		return err
	}
	if err := unix.Mknod(p, unix.S_IFCHR|0o000, 0); err != nil {
		return fmt.Errorf("make whiteout: %w", err)
	}
	return os.Lchown(p, u.base, u.base)
}

// attrs applies ownership, mode, user xattrs and times of hdr to p.
func (u *unpacker) attrs(p string, hdr *tar.Header, isDir bool) error {
	uid, gid, err := u.ids(hdr)
	if err != nil {
		return err
	}
	if err := os.Lchown(p, uid, gid); err != nil {
		return err
	}
	for k, v := range hdr.PAXRecords {
		// Only user.* xattrs: trusted.* would let a layer steer overlayfs
		// and security.* would be ignored in the user namespace anyway.
		if name, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok && strings.HasPrefix(name, "user.") {
			_ = unix.Lsetxattr(p, name, []byte(v), 0)
		}
	}
	if hdr.Typeflag == tar.TypeSymlink {
		ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
		_ = unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
		return nil
	}
	// After chown, which clears setuid/setgid.
	if err := unix.Chmod(p, uint32(hdr.Mode)&0o7777); err != nil {
		return err
	}
	if !isDir {
		ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
		_ = unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
	}
	return nil
}
