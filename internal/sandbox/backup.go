package sandbox

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/backupstore"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/runtime"
	"github.com/nookhq/nook/internal/store"
)

const backupBucket = "backups"

// Backup limits.
const (
	MaxBackupTTL = 365 * 24 * time.Hour
	backupSweep  = 30 * time.Second
)

// Backup is a compressed archive (tar + gzip) of one directory tree of a
// sandbox, kept in DATA/backups. Only files are in it: no processes, mounts
// or stored env names.
type Backup struct {
	ID        string     `json:"id"`
	Name      string     `json:"name,omitempty"`
	SandboxID string     `json:"sandboxID"`
	Dir       string     `json:"dir"`
	Excludes  []string   `json:"excludes,omitempty"`
	Gitignore bool       `json:"gitignore,omitempty"`
	SizeBytes int64      `json:"sizeBytes"` // of the archive
	Files     int        `json:"files"`
	Digest    string     `json:"digest"` // sha256 of the archive
	CreatedAt time.Time  `json:"createdAt"`
	ExpiresAt *time.Time `json:"expiresAt,omitempty"`
	// Remote is where the copy in the backup bucket is (endpoint/bucket/id;
	// no credentials), when one was configured at the backup's creation.
	Remote string `json:"remote,omitempty"`
}

// BackupOptions are what a caller chooses for a backup (Cloudflare's
// createBackup({dir, name, ttl, excludes, gitignore})).
type BackupOptions struct {
	Dir       string
	Name      string
	TTL       time.Duration // 0: kept until deleted
	Excludes  []string      // globs relative to Dir, gitignore syntax
	Gitignore bool          // also honour .gitignore files in the tree
}

func (m *Manager) backupRoot() string { return filepath.Join(m.cfg.DataDir, "backups") }

// localBackups is nook's own store of archives: DATA/backups/ID.tar.gz.
func (m *Manager) localBackups() backupstore.Dir {
	return backupstore.Dir{Path: m.backupRoot(), Suffix: ".tar.gz"}
}

func (m *Manager) backupPath(id string) string { return m.localBackups().File(id) }

// remoteOf is the remote store holding b's copy, nil when b has none or no
// remote store is configured now.
func (m *Manager) remoteOf(b Backup) backupstore.Store {
	if b.Remote == "" || m.cfg.BackupRemote == nil {
		return nil
	}
	return m.cfg.BackupRemote
}

// deleteRemote deletes b's copy in the backup bucket.
func (m *Manager) deleteRemote(ctx context.Context, b Backup) error {
	if b.Remote == "" {
		return nil
	}
	r := m.remoteOf(b)
	if r == nil {
		m.cfg.Log.Warn("backup bucket not configured; its copy of the backup stays", "backup", b.ID, "remote", b.Remote)
		return nil
	}
	if err := r.Delete(ctx, b.ID); err != nil {
		return fmt.Errorf("backup %q: deleting its copy in the backup bucket: %v: %w", b.ID, err, errdefs.ErrUnavailable)
	}
	return nil
}

// GetBackup returns a backup by id.
func (m *Manager) GetBackup(id string) (Backup, error) {
	if !ValidID(strings.TrimPrefix(id, "bk-")) || !strings.HasPrefix(id, "bk-") {
		return Backup{}, fmt.Errorf("backup id %q: %w", id, errdefs.ErrInvalid)
	}
	var b Backup
	if err := m.cfg.Store.Get(backupBucket, id, &b); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return Backup{}, fmt.Errorf("backup %q: %w", id, errdefs.ErrNotFound)
		}
		return Backup{}, err
	}
	if b.ExpiresAt != nil && !b.ExpiresAt.After(time.Now()) {
		return Backup{}, fmt.Errorf("backup %q has expired: %w", id, errdefs.ErrNotFound)
	}
	return b, nil
}

// ListBackups returns the live backups (of one sandbox when sandboxID is
// set), newest first.
func (m *Manager) ListBackups(sandboxID string) ([]Backup, error) {
	all, err := store.All[Backup](m.cfg.Store, backupBucket)
	if err != nil {
		return nil, err
	}
	out := all[:0]
	now := time.Now()
	for _, b := range all {
		if (sandboxID == "" || b.SandboxID == sandboxID) && (b.ExpiresAt == nil || b.ExpiresAt.After(now)) {
			out = append(out, b)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.After(out[j].CreatedAt) })
	return out, nil
}

// DeleteBackup removes a backup, its archive and its copy in the backup
// bucket. When the bucket cannot be reached the backup is kept (503) so
// the delete can be retried.
func (m *Manager) DeleteBackup(id string) error {
	b, err := m.GetBackup(id)
	if err != nil {
		return err
	}
	if err := m.deleteRemote(context.Background(), b); err != nil {
		return err
	}
	if err := m.cfg.Store.Delete(backupBucket, id); err != nil {
		return err
	}
	return os.RemoveAll(m.backupPath(id))
}

// cleanDir checks a sandbox path: absolute, cleaned.
func cleanDir(dir string) (string, error) {
	if dir == "" || !strings.HasPrefix(dir, "/") || strings.ContainsRune(dir, 0) {
		return "", fmt.Errorf("dir %q: want an absolute path: %w", dir, errdefs.ErrInvalid)
	}
	return path.Clean(dir), nil
}

// frozenRoot freezes a running sandbox and opens its merged root; done
// closes and thaws.
func (m *Manager) frozenRoot(ctx context.Context, id string) (rootFD int, done func(), err error) {
	l, err := m.lookup(id)
	if err != nil {
		return -1, nil, err
	}
	m.mu.Lock()
	state := l.rec.State
	m.mu.Unlock()
	if state == StatePaused {
		return -1, nil, fmt.Errorf("sandbox %q is paused; resume it first: %w", id, ErrPaused)
	}
	p, ok := m.cfg.Runtime.(runtime.Pauser)
	if !ok {
		return -1, nil, fmt.Errorf("this runtime cannot reach sandbox files: %w", errdefs.ErrConflict)
	}
	if err := p.Freeze(ctx, id, false); err != nil {
		return -1, nil, err
	}
	fd, err := unix.Open(p.RootPath(id), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		p.Freeze(context.WithoutCancel(ctx), id, true)
		return -1, nil, fmt.Errorf("open sandbox root: %w", err)
	}
	return fd, func() {
		unix.Close(fd)
		if err := p.Freeze(context.WithoutCancel(ctx), id, true); err != nil {
			m.cfg.Log.Error("thaw sandbox", "id", id, "err", err)
		}
	}, nil
}

// openIn opens rel below the directory dirfd as if dirfd were "/": no
// symlink or ".." leads outside it.
func openIn(dirfd int, rel string, flags uint64) (int, error) {
	if rel == "" || rel == "/" {
		rel = "."
	}
	return unix.Openat2(dirfd, rel, &unix.OpenHow{
		Flags:   flags | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
}

// CreateBackup archives directory o.Dir of running sandbox id. The
// sandbox's processes are frozen while it is read, so the archive is one
// consistent picture; the archive is written to a temporary file, flushed
// and renamed, then copied to the backup bucket when one is configured
// (object key = backup id, sha256 in its metadata), and only then
// recorded.
func (m *Manager) CreateBackup(ctx context.Context, id string, o BackupOptions) (Backup, error) {
	dir, err := cleanDir(o.Dir)
	if err != nil {
		return Backup{}, err
	}
	if o.TTL < 0 || o.TTL > MaxBackupTTL {
		return Backup{}, fmt.Errorf("ttl must be between 0 and %s: %w", MaxBackupTTL, errdefs.ErrInvalid)
	}
	if len(o.Name) > 256 {
		return Backup{}, fmt.Errorf("name longer than 256 bytes: %w", errdefs.ErrInvalid)
	}
	excl, err := newIgnorer(o.Excludes)
	if err != nil {
		return Backup{}, err
	}
	if !ValidID(id) {
		return Backup{}, fmt.Errorf("sandbox id %q: %w", id, errdefs.ErrInvalid)
	}
	ctx = context.WithoutCancel(ctx)
	b := Backup{
		ID: "bk-" + newID()[1:], Name: o.Name, SandboxID: id, Dir: dir, Excludes: o.Excludes,
		Gitignore: o.Gitignore, CreatedAt: time.Now().UTC(),
	}
	if o.TTL > 0 {
		t := b.CreatedAt.Add(o.TTL)
		b.ExpiresAt = &t
	}
	if err := m.writeArchive(ctx, id, &b, excl); err != nil {
		return Backup{}, err
	}
	// The sandbox runs on while the copy goes to the bucket.
	if r := m.cfg.BackupRemote; r != nil {
		start := time.Now()
		err := func() error {
			f, err := os.Open(m.backupPath(b.ID))
			if err != nil {
				return err
			}
			defer f.Close()
			return r.Put(ctx, b.ID, f, b.SizeBytes, b.Digest)
		}()
		if err != nil {
			os.Remove(m.backupPath(b.ID))
			return Backup{}, fmt.Errorf("backup of sandbox %s: copying it to the backup bucket failed (nothing was kept): %v: %w", id, err, errdefs.ErrUnavailable)
		}
		b.Remote = r.String() + "/" + b.ID
		m.cfg.Log.Info("backup uploaded", "backup", b.ID, "remote", b.Remote, "bytes", b.SizeBytes, "took", time.Since(start).Round(time.Millisecond))
	}
	if err := m.cfg.Store.Put(backupBucket, b.ID, b); err != nil {
		os.Remove(m.backupPath(b.ID))
		if r := m.remoteOf(b); r != nil {
			r.Delete(ctx, b.ID)
		}
		return Backup{}, err
	}
	m.cfg.Log.Info("backup created", "backup", b.ID, "sandbox", id, "dir", dir, "files", b.Files, "bytes", b.SizeBytes)
	return b, nil
}

// writeArchive archives b.Dir of sandbox id, frozen meanwhile, into the
// local store (through a temporary file, flushed and renamed) and fills in
// b's size, file count and digest.
func (m *Manager) writeArchive(ctx context.Context, id string, b *Backup, excl *ignorer) error {
	defer m.ops.lock(id)()
	rootFD, done, err := m.frozenRoot(ctx, id)
	if err != nil {
		return err
	}
	h := sha256.New()
	var size countWriter
	pr, pw := io.Pipe()
	walked := make(chan error, 1)
	go func() {
		err := func() error {
			defer done()
			dirFD, err := openIn(rootFD, b.Dir, unix.O_RDONLY|unix.O_DIRECTORY)
			if err != nil {
				return fmt.Errorf("dir %q in sandbox %s: %v: %w", b.Dir, id, err, errdefs.ErrInvalid)
			}
			defer unix.Close(dirFD)
			bw := bufio.NewWriterSize(io.MultiWriter(pw, h, &size), 1<<20)
			zw, _ := gzip.NewWriterLevel(bw, gzip.BestSpeed)
			tw := tar.NewWriter(zw)
			w := &archiver{tw: tw, excl: excl, gitignore: b.Gitignore, top: b.Dir == "/"}
			if err := w.walk(dirFD, "", nil); err != nil {
				return err
			}
			b.Files = w.files
			for _, c := range []io.Closer{tw, zw} {
				if err := c.Close(); err != nil {
					return err
				}
			}
			return bw.Flush()
		}()
		pw.CloseWithError(err) // nil: the reader sees EOF
		walked <- err
	}()
	local := m.localBackups()
	err = local.Put(ctx, b.ID, pr, -1, "")
	// Unblock the archiver if the store stopped reading early.
	pr.CloseWithError(errors.New("backup store failed"))
	if werr := <-walked; werr != nil {
		err = werr
	}
	if err != nil {
		local.Delete(ctx, b.ID)
		return err
	}
	b.SizeBytes = int64(size)
	b.Digest = hex.EncodeToString(h.Sum(nil))
	return nil
}

type countWriter int64

func (c *countWriter) Write(p []byte) (int, error) {
	*c += countWriter(len(p))
	return len(p), nil
}

// archiver writes a directory tree, read through file descriptors that
// never follow a symlink, to a tar stream with sandbox-side owners.
type archiver struct {
	tw        *tar.Writer
	excl      *ignorer
	gitignore bool
	top       bool // archiving "/": skip nook's own mount points
	files     int
}

func sandboxID(hostID uint32) int {
	if hostID >= runtime.HostUIDBase && hostID < runtime.HostUIDBase+runtime.IDMapSize {
		return int(hostID - runtime.HostUIDBase)
	}
	return 65534 // nobody: not an id of the sandbox
}

func (a *archiver) walk(dirFD int, rel string, ign []*ignorer) error {
	// Read the names through a duplicate: an *os.File closes its fd when
	// it is collected, and dirFD is the caller's.
	dup, err := unix.Dup(dirFD)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(dup), rel)
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return fmt.Errorf("read dir %q: %w", "/"+rel, err)
	}
	sort.Strings(names)
	if a.gitignore {
		if fd, err := unix.Openat(dirFD, ".gitignore", unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
			f := os.NewFile(uintptr(fd), ".gitignore")
			data, _ := io.ReadAll(io.LimitReader(f, 1<<20))
			f.Close()
			gi, _ := newIgnorer(strings.Split(string(data), "\n"))
			gi.base = rel
			ign = append(append([]*ignorer(nil), ign...), gi)
		}
	}
	for _, name := range names {
		p := path.Join(rel, name)
		if a.top && rel == "" && (name == ".nook" || name == "proc" || name == "sys" || name == "dev") {
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dirFD, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return err
		}
		isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		if a.excl.match(p, isDir) {
			continue
		}
		skip := false
		for _, gi := range ign {
			if r, ok := strings.CutPrefix(p, gi.base); ok && (gi.base == "" || strings.HasPrefix(r, "/")) {
				if gi.match(strings.TrimPrefix(r, "/"), isDir) {
					skip = true
				}
			}
		}
		if skip {
			continue
		}
		hdr := &tar.Header{
			Name: p, Mode: int64(st.Mode & 0o7777), Uid: sandboxID(st.Uid), Gid: sandboxID(st.Gid),
			ModTime: time.Unix(st.Mtim.Unix()), Format: tar.FormatPAX,
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			hdr.Typeflag, hdr.Name = tar.TypeDir, p+"/"
			if err := a.tw.WriteHeader(hdr); err != nil {
				return err
			}
			a.files++
			fd, err := unix.Openat(dirFD, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("open %q: %w", "/"+p, err)
			}
			err = a.walk(fd, p, ign)
			unix.Close(fd)
			if err != nil {
				return err
			}
		case unix.S_IFREG:
			fd, err := unix.Openat(dirFD, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("open %q: %w", "/"+p, err)
			}
			f := os.NewFile(uintptr(fd), p)
			hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size
			if err := a.tw.WriteHeader(hdr); err != nil {
				f.Close()
				return err
			}
			_, err = io.CopyN(a.tw, f, st.Size)
			f.Close()
			if err != nil {
				return fmt.Errorf("read %q: %w", "/"+p, err)
			}
			a.files++
		case unix.S_IFLNK:
			buf := make([]byte, 4096)
			n, err := unix.Readlinkat(dirFD, name, buf)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, string(buf[:n])
			if err := a.tw.WriteHeader(hdr); err != nil {
				return err
			}
			a.files++
		default:
			// Devices, sockets and FIFOs are not files to keep.
		}
	}
	return nil
}

// ignorer matches paths against gitignore-style patterns: a pattern with a
// slash (other than a trailing one) is anchored to base, otherwise it
// matches any path component's name; a trailing slash matches only
// directories; "!" negates; "**" matches any number of directories.
type ignorer struct {
	base  string
	rules []ignoreRule
}

type ignoreRule struct {
	pat      string
	anchored bool
	dirOnly  bool
	negate   bool
}

func newIgnorer(patterns []string) (*ignorer, error) {
	ig := &ignorer{}
	for _, p := range patterns {
		p = strings.TrimRight(p, " \r")
		if p == "" || strings.HasPrefix(p, "#") {
			continue
		}
		r := ignoreRule{}
		if strings.HasPrefix(p, "!") {
			r.negate, p = true, p[1:]
		}
		if strings.HasSuffix(p, "/") {
			r.dirOnly, p = true, strings.TrimRight(p, "/")
		}
		if strings.Contains(p, "/") {
			r.anchored, p = true, strings.TrimPrefix(p, "/")
		}
		if _, err := path.Match(strings.ReplaceAll(p, "**", "*"), ""); err != nil {
			return nil, fmt.Errorf("exclude pattern %q: %v: %w", p, err, errdefs.ErrInvalid)
		}
		r.pat = p
		ig.rules = append(ig.rules, r)
	}
	return ig, nil
}

// match reports whether rel (relative to the ignorer's base) is ignored.
func (ig *ignorer) match(rel string, isDir bool) bool {
	if ig == nil {
		return false
	}
	ignored := false
	for _, r := range ig.rules {
		if r.dirOnly && !isDir {
			continue
		}
		var ok bool
		if r.anchored {
			ok = globMatch(r.pat, rel)
		} else {
			ok = globMatch(r.pat, path.Base(rel))
		}
		if ok {
			ignored = !r.negate
		}
	}
	return ignored
}

// globMatch is path.Match with "**" matching any number of path elements.
func globMatch(pat, name string) bool {
	if !strings.Contains(pat, "**") {
		ok, _ := path.Match(pat, name)
		return ok
	}
	pre, post, _ := strings.Cut(pat, "**")
	post = strings.TrimPrefix(post, "/")
	pre = strings.TrimSuffix(pre, "/")
	parts := strings.Split(name, "/")
	for i := 0; i <= len(parts); i++ {
		head := strings.Join(parts[:i], "/")
		if pre != "" {
			if ok, _ := path.Match(pre, head); !ok {
				continue
			}
		} else if i != 0 {
			// "**/x": any leading directories.
		}
		for j := i; j <= len(parts); j++ {
			tail := strings.Join(parts[j:], "/")
			if post == "" || globMatch(post, tail) {
				return true
			}
		}
		if pre != "" {
			break
		}
	}
	return false
}

// VerifyBackup checks a backup's archive against its recorded digest: the
// local copy when there is one, and the copy in the backup bucket when
// there is one.
func (m *Manager) VerifyBackup(ctx context.Context, b Backup) error {
	checked := false
	if f, err := os.Open(m.backupPath(b.ID)); err == nil {
		err = checkDigest(b, f, "archive")
		f.Close()
		if err != nil {
			return err
		}
		checked = true
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("backup %q: archive unreadable: %v: %w", b.ID, err, ErrCorrupt)
	}
	if r := m.remoteOf(b); r != nil {
		rc, err := r.Get(ctx, b.ID)
		if err != nil {
			return m.remoteReadError(b, err)
		}
		err = checkDigest(b, rc, "copy in the backup bucket")
		rc.Close()
		if err != nil {
			return err
		}
		checked = true
	}
	if !checked {
		return fmt.Errorf("backup %q: archive missing: %w", b.ID, ErrCorrupt)
	}
	return nil
}

// remoteReadError is the error for a failed read of b's copy in the bucket.
func (m *Manager) remoteReadError(b Backup, err error) error {
	if errors.Is(err, backupstore.ErrNotFound) {
		return fmt.Errorf("backup %q: its archive is missing here and in the backup bucket: %w", b.ID, ErrCorrupt)
	}
	return fmt.Errorf("backup %q: reading its copy in the backup bucket: %v: %w", b.ID, err, errdefs.ErrUnavailable)
}

// checkDigest reads r to its end and compares its sha256 with b's.
func checkDigest(b Backup, r io.Reader, what string) error {
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		return fmt.Errorf("backup %q: %s unreadable: %v: %w", b.ID, what, err, ErrCorrupt)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != b.Digest {
		return fmt.Errorf("backup %q is corrupted: %s sha256 %s, recorded %s; refusing to restore it: %w", b.ID, what, got, b.Digest, ErrCorrupt)
	}
	return nil
}

// openBackup opens b's archive, checked against its digest: the local
// copy, or, when that is gone, the copy in the backup bucket, fetched into
// the local store (to a temporary file, checked, then renamed into place).
func (m *Manager) openBackup(ctx context.Context, b Backup) (*os.File, error) {
	f, err := os.Open(m.backupPath(b.ID))
	if errors.Is(err, fs.ErrNotExist) {
		if r := m.remoteOf(b); r != nil {
			return m.fetchBackup(ctx, r, b)
		}
		return nil, fmt.Errorf("backup %q: archive missing: %w", b.ID, ErrCorrupt)
	}
	if err != nil {
		return nil, fmt.Errorf("backup %q: archive unreadable: %v: %w", b.ID, err, ErrCorrupt)
	}
	if err := checkDigest(b, f, "archive"); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func (m *Manager) fetchBackup(ctx context.Context, r backupstore.Store, b Backup) (*os.File, error) {
	start := time.Now()
	rc, err := r.Get(ctx, b.ID)
	if err != nil {
		return nil, m.remoteReadError(b, err)
	}
	defer rc.Close()
	if err := os.MkdirAll(m.backupRoot(), 0o700); err != nil {
		return nil, err
	}
	// A name of its own: several restores may fetch the same backup.
	tmp, err := os.CreateTemp(m.backupRoot(), b.ID+".tar.gz.*.tmp")
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*os.File, error) {
		tmp.Close()
		os.Remove(tmp.Name())
		return nil, err
	}
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(tmp, h), rc); err != nil {
		return fail(fmt.Errorf("backup %q: downloading its copy from the backup bucket: %v: %w", b.ID, err, errdefs.ErrUnavailable))
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != b.Digest {
		return fail(fmt.Errorf("backup %q is corrupted: copy in the backup bucket has sha256 %s, recorded %s; refusing to restore it: %w", b.ID, got, b.Digest, ErrCorrupt))
	}
	if err := tmp.Sync(); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp.Name(), m.backupPath(b.ID)); err != nil {
		return fail(err)
	}
	syncDir(m.backupRoot())
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return fail(err)
	}
	m.cfg.Log.Info("backup fetched from the backup bucket", "backup", b.ID, "bytes", b.SizeBytes, "took", time.Since(start).Round(time.Millisecond))
	return tmp, nil
}

// RestoreBackup extracts backup backupID into directory dir (the backup's
// own dir when empty) of running sandbox id, which may be another sandbox
// than the one backed up. Files in the archive replace those at the same
// paths; other files stay. The archive (local, or from the backup bucket
// when the local copy is gone) is checked against its digest first and
// refused when it does not match.
func (m *Manager) RestoreBackup(ctx context.Context, backupID, id, dir string) (Backup, error) {
	b, err := m.GetBackup(backupID)
	if err != nil {
		return Backup{}, err
	}
	if dir == "" {
		dir = b.Dir
	}
	if dir, err = cleanDir(dir); err != nil {
		return b, err
	}
	if !ValidID(id) {
		return b, fmt.Errorf("sandbox id %q: %w", id, errdefs.ErrInvalid)
	}
	if _, err := m.lookup(id); err != nil {
		return b, err
	}
	ctx = context.WithoutCancel(ctx)
	f, err := m.openBackup(ctx, b)
	if err != nil {
		return b, err
	}
	defer f.Close()
	defer m.ops.lock(id)()
	rootFD, done, err := m.frozenRoot(ctx, id)
	if err != nil {
		return b, err
	}
	defer done()
	dirFD, err := mkdirAllIn(rootFD, dir)
	if err != nil {
		return b, fmt.Errorf("dir %q in sandbox %s: %w", dir, id, err)
	}
	defer unix.Close(dirFD)
	zr, err := gzip.NewReader(bufio.NewReaderSize(f, 1<<20))
	if err != nil {
		return b, fmt.Errorf("backup %q: %v: %w", b.ID, err, ErrCorrupt)
	}
	tr := tar.NewReader(zr)
	var dirs []*tar.Header
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return b, fmt.Errorf("backup %q: %v: %w", b.ID, err, ErrCorrupt)
		}
		if err := extract(dirFD, hdr, tr); err != nil {
			return b, fmt.Errorf("restore %q: %w", hdr.Name, err)
		}
		if hdr.Typeflag == tar.TypeDir {
			dirs = append(dirs, hdr)
		}
	}
	// Directory modes and times last, once their contents are written.
	for i := len(dirs) - 1; i >= 0; i-- {
		h := dirs[i]
		name := strings.TrimSuffix(path.Clean(h.Name), "/")
		if fd, err := openIn(dirFD, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW); err == nil {
			unix.Fchmod(fd, uint32(h.Mode&0o7777))
			unix.Futimes(fd, []unix.Timeval{unix.NsecToTimeval(h.ModTime.UnixNano()), unix.NsecToTimeval(h.ModTime.UnixNano())})
			unix.Close(fd)
		}
	}
	m.cfg.Log.Info("backup restored", "backup", b.ID, "sandbox", id, "dir", dir)
	return b, nil
}

func hostID(id int) int {
	if id < 0 || id >= runtime.IDMapSize {
		id = 65534
	}
	return id + runtime.HostUIDBase
}

// mkdirAllIn opens dir below rootFD, making missing directories (owned by
// the sandbox's root).
func mkdirAllIn(rootFD int, dir string) (int, error) {
	fd, err := unix.Dup(rootFD)
	if err != nil {
		return -1, err
	}
	cur := "."
	for _, part := range strings.Split(strings.Trim(dir, "/"), "/") {
		if part == "" {
			continue
		}
		next, err := openIn(fd, part, unix.O_RDONLY|unix.O_DIRECTORY)
		if errors.Is(err, unix.ENOENT) {
			if err := unix.Mkdirat(fd, part, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				unix.Close(fd)
				return -1, err
			}
			unix.Fchownat(fd, part, runtime.HostUIDBase, runtime.HostUIDBase, unix.AT_SYMLINK_NOFOLLOW)
			next, err = openIn(fd, part, unix.O_RDONLY|unix.O_DIRECTORY)
		}
		unix.Close(fd)
		if err != nil {
			return -1, fmt.Errorf("%s/%s: %w", cur, part, err)
		}
		fd, cur = next, cur+"/"+part
	}
	return fd, nil
}

// extract writes one archive entry below dirFD without following any
// symlink out of it.
func extract(dirFD int, hdr *tar.Header, r io.Reader) error {
	name := path.Clean(strings.TrimPrefix(hdr.Name, "/"))
	if name == "." || name == ".." || strings.HasPrefix(name, "../") {
		return fmt.Errorf("bad entry name %q: %w", hdr.Name, ErrCorrupt)
	}
	parent, base := path.Split(name)
	pfd, err := mkdirAllIn(dirFD, parent)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	uid, gid := hostID(hdr.Uid), hostID(hdr.Gid)
	mode := uint32(hdr.Mode & 0o7777)
	removeNonDir := func() {
		var st unix.Stat_t
		if unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			unix.Unlinkat(pfd, base, 0)
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		var st unix.Stat_t
		if unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			unix.Unlinkat(pfd, base, 0)
		}
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return err
		}
		return unix.Fchownat(pfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
	case tar.TypeReg:
		removeNonDir()
		fd, err := unix.Openat(pfd, base, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), base)
		defer f.Close()
		if _, err := io.CopyN(f, r, hdr.Size); err != nil {
			return fmt.Errorf("%v: %w", err, ErrCorrupt)
		}
		if err := unix.Fchown(fd, uid, gid); err != nil {
			return err
		}
		if err := unix.Fchmod(fd, mode); err != nil {
			return err
		}
		t := unix.NsecToTimeval(hdr.ModTime.UnixNano())
		unix.Futimes(fd, []unix.Timeval{t, t})
		return f.Close()
	case tar.TypeSymlink:
		removeNonDir()
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return err
		}
		return unix.Fchownat(pfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
	default:
		return nil // nook's archives hold nothing else
	}
}

// sweepBackups deletes expired backups, archives without a record and
// half-written archives, now and then every 30 s.
func (m *Manager) sweepBackups() {
	m.sweepBackupsOnce(true)
	go func() {
		for range time.Tick(backupSweep) {
			m.sweepBackupsOnce(false)
		}
	}()
}

func (m *Manager) sweepBackupsOnce(startup bool) {
	all, err := store.All[Backup](m.cfg.Store, backupBucket)
	if err != nil {
		m.cfg.Log.Error("list backups", "err", err)
		return
	}
	known := map[string]bool{}
	now := time.Now()
	for _, b := range all {
		if b.ExpiresAt != nil && !b.ExpiresAt.After(now) {
			m.cfg.Log.Info("backup expired; deleting it", "backup", b.ID)
			os.Remove(m.backupPath(b.ID))
			// The record stays until the bucket's copy is gone: the next
			// sweep tries again.
			if err := m.deleteRemote(context.Background(), b); err != nil {
				m.cfg.Log.Warn("expired backup: will retry", "backup", b.ID, "err", err)
				continue
			}
			m.cfg.Store.Delete(backupBucket, b.ID)
			continue
		}
		known[b.ID+".tar.gz"] = true
	}
	entries, _ := os.ReadDir(m.backupRoot())
	for _, e := range entries {
		if !known[e.Name()] {
			info, err := e.Info()
			// A .tmp may belong to a backup being written right now.
			if !startup && err == nil && strings.HasSuffix(e.Name(), ".tmp") && now.Sub(info.ModTime()) < time.Hour {
				continue
			}
			m.cfg.Log.Warn("removing unknown or unfinished backup archive", "file", e.Name())
			os.Remove(filepath.Join(m.backupRoot(), e.Name()))
		}
	}
}
