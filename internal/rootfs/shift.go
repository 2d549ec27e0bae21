// Package rootfs prepares template root filesystems: the default Debian base
// built with mmdebstrap, and the ownership shift that lets a sandbox's user
// namespace see the files as their original owners.
package rootfs

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// Shift adds base to the owner and group of every file under root, without
// following symlinks, keeping setuid/setgid bits (which chown clears).
// A file whose ids are already at or above base is left as it is, so a
// second run after a crash does not shift twice.
func Shift(root string, base uint32) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no ownership information", path)
		}
		if st.Uid >= base && st.Gid >= base {
			return nil
		}
		uid, gid := st.Uid, st.Gid
		if uid < base {
			uid += base
		}
		if gid < base {
			gid += base
		}
		if err := os.Lchown(path, int(uid), int(gid)); err != nil {
			return err
		}
		// chown clears setuid/setgid on regular files: put them back.
		if d.Type().IsRegular() && st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
			return unix.Chmod(path, st.Mode&0o7777)
		}
		return nil
	})
}
