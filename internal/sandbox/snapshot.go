package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/runtime"
	"github.com/nookhq/nook/internal/runtime/runc"
	"github.com/nookhq/nook/internal/store"
	"github.com/nookhq/nook/internal/template"
)

const snapshotBucket = "snapshots"

// Snapshot is a sandbox's filesystem frozen into a template-like image: its
// writable layer stored as a read-only layer on top of the layers the
// sandbox ran on. Sandboxes are created from it by using its id as the
// template id.
type Snapshot struct {
	ID        string `json:"id"`
	SandboxID string `json:"sandboxID"`
	// TemplateID is the template whose settings (start command, env,
	// limits) sandboxes of the snapshot get.
	TemplateID string `json:"templateID"`
	// Layers are the read-only layers, topmost first: the snapshot's own
	// (Layers[0]) and then those of the sandbox it was taken of.
	Layers    []string  `json:"layers"`
	Runtime   string    `json:"runtime,omitempty"`
	SizeBytes int64     `json:"sizeBytes"`
	Files     int       `json:"files"`
	Digest    string    `json:"digest"`
	CreatedAt time.Time `json:"createdAt"`
	// TookMs is how long taking the snapshot froze the sandbox.
	TookMs int64 `json:"tookMs"`
}

func (m *Manager) snapshotRoot() string { return filepath.Join(m.cfg.DataDir, "snapshots") }

// GetSnapshot returns a snapshot by id.
func (m *Manager) GetSnapshot(id string) (Snapshot, error) {
	if !template.ValidID(id) {
		return Snapshot{}, fmt.Errorf("snapshot id %q: %w", id, errdefs.ErrInvalid)
	}
	var s Snapshot
	if err := m.cfg.Store.Get(snapshotBucket, id, &s); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return Snapshot{}, fmt.Errorf("snapshot %q: %w", id, errdefs.ErrNotFound)
		}
		return Snapshot{}, err
	}
	return s, nil
}

// ListSnapshots returns every snapshot, newest first.
func (m *Manager) ListSnapshots() ([]Snapshot, error) {
	all, err := store.All[Snapshot](m.cfg.Store, snapshotBucket)
	if err != nil {
		return nil, err
	}
	sort.Slice(all, func(i, j int) bool {
		if !all[i].CreatedAt.Equal(all[j].CreatedAt) {
			return all[i].CreatedAt.After(all[j].CreatedAt)
		}
		return all[i].ID < all[j].ID
	})
	return all, nil
}

// resolveTemplate finds a template, or a snapshot as a template.
func (m *Manager) resolveTemplate(idOrAlias string) (template.Template, error) {
	if template.ValidID(idOrAlias) {
		var s Snapshot
		if err := m.cfg.Store.Get(snapshotBucket, idOrAlias, &s); err == nil {
			return m.snapshotTemplate(s)
		}
	}
	return m.cfg.Templates.Get(idOrAlias)
}

func (m *Manager) snapshotTemplate(s Snapshot) (template.Template, error) {
	tpl, err := m.cfg.Templates.Get(s.TemplateID)
	if err != nil {
		return template.Template{}, fmt.Errorf("template %q of snapshot %q: %w", s.TemplateID, s.ID, err)
	}
	if _, err := os.Stat(s.Layers[0]); err != nil {
		return template.Template{}, fmt.Errorf("snapshot %q: its layer is missing: %v: %w", s.ID, err, errdefs.ErrConflict)
	}
	tpl.ID, tpl.Aliases, tpl.Layers, tpl.Runtime = s.ID, nil, s.Layers, s.Runtime
	none := 0
	tpl.PoolSize = &none
	return tpl, nil
}

// templateFor is the template a sandbox (re)starts from: its template or
// snapshot, with the layers of a rollback.
func (m *Manager) templateFor(rec Sandbox) (template.Template, error) {
	tpl, err := m.resolveTemplate(rec.TemplateID)
	if err != nil {
		return tpl, err
	}
	if len(rec.Layers) > 0 {
		tpl.Layers = rec.Layers
	}
	tpl.Runtime = rec.Runtime
	return tpl, nil
}

// rootTemplate is the template id whose settings a sandbox runs with.
func (m *Manager) rootTemplate(rec Sandbox) string {
	var s Snapshot
	if err := m.cfg.Store.Get(snapshotBucket, rec.TemplateID, &s); err == nil {
		return s.TemplateID
	}
	return rec.TemplateID
}

// copyLayer copies sandbox id's current writable layer to dst: from the
// running sandbox (frozen while it copies) or from its paused state.
func (m *Manager) copyLayer(ctx context.Context, rec Sandbox, dst string) error {
	if rec.State == StatePaused {
		return runc.CopyTree(filepath.Join(m.pauseDir(rec.ID), runtime.PauseUpper), dst)
	}
	p, ok := m.cfg.Runtime.(runtime.Pauser)
	if !ok {
		return fmt.Errorf("this runtime cannot copy a sandbox's layer: %w", errdefs.ErrConflict)
	}
	return p.CopyLayer(ctx, rec.ID, dst)
}

// CreateSnapshot snapshots sandbox id (running or paused) under name (a
// generated id when empty). The sandbox's processes are frozen while its
// writable layer is copied, then continue.
func (m *Manager) CreateSnapshot(ctx context.Context, sandboxID, name string) (Snapshot, error) {
	if !ValidID(sandboxID) {
		return Snapshot{}, fmt.Errorf("sandbox id %q: %w", sandboxID, errdefs.ErrInvalid)
	}
	id := name
	if id == "" {
		id = "snap-" + newID()[1:13]
	}
	if !template.ValidID(id) {
		return Snapshot{}, fmt.Errorf("snapshot name %q: want 1-63 of a-z, 0-9, '-', '_': %w", name, errdefs.ErrInvalid)
	}
	if _, err := m.resolveTemplate(id); err == nil {
		return Snapshot{}, fmt.Errorf("a template or snapshot %q exists already: %w", id, errdefs.ErrConflict)
	}
	defer m.ops.lock(sandboxID)()
	ctx = context.WithoutCancel(ctx)
	l, err := m.lookup(sandboxID)
	if err != nil {
		return Snapshot{}, err
	}
	m.mu.Lock()
	rec := l.rec
	m.mu.Unlock()
	tpl, err := m.templateFor(rec)
	if err != nil {
		return Snapshot{}, err
	}
	if err := os.MkdirAll(m.snapshotRoot(), 0o711); err != nil {
		return Snapshot{}, err
	}
	final := filepath.Join(m.snapshotRoot(), id)
	tmp := final + ".tmp"
	os.RemoveAll(tmp)
	if err := os.Mkdir(tmp, 0o711); err != nil {
		return Snapshot{}, err
	}
	defer os.RemoveAll(tmp)
	start := time.Now()
	if err := m.copyLayer(ctx, rec, filepath.Join(tmp, "layer")); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot sandbox %s: %w", sandboxID, err)
	}
	took := time.Since(start)
	digest, size, files, err := TreeDigest(filepath.Join(tmp, "layer"))
	if err != nil {
		return Snapshot{}, err
	}
	if err := syncTree(tmp); err != nil {
		return Snapshot{}, err
	}
	if _, err := os.Stat(final); err == nil {
		return Snapshot{}, fmt.Errorf("snapshot dir %s exists already: %w", final, errdefs.ErrConflict)
	}
	if err := os.Rename(tmp, final); err != nil {
		return Snapshot{}, err
	}
	if err := syncDir(m.snapshotRoot()); err != nil {
		return Snapshot{}, err
	}
	s := Snapshot{
		ID: id, SandboxID: sandboxID, TemplateID: m.rootTemplate(rec),
		Layers:  append([]string{filepath.Join(final, "layer")}, tpl.Layers...),
		Runtime: rec.Runtime, SizeBytes: size, Files: files, Digest: digest,
		CreatedAt: time.Now().UTC(), TookMs: took.Milliseconds(),
	}
	if err := m.cfg.Store.Put(snapshotBucket, id, s); err != nil {
		os.RemoveAll(final)
		return Snapshot{}, err
	}
	m.cfg.Log.Info("snapshot taken", "snapshot", id, "sandbox", sandboxID, "bytes", size, "frozen", took.Round(time.Millisecond))
	return s, nil
}

// VerifySnapshot recomputes a snapshot's digest and compares it with the
// stored one.
func (m *Manager) VerifySnapshot(id string) error {
	s, err := m.GetSnapshot(id)
	if err != nil {
		return err
	}
	digest, _, _, err := TreeDigest(s.Layers[0])
	if err != nil {
		return fmt.Errorf("snapshot %q is unreadable: %v: %w", id, err, ErrCorrupt)
	}
	if digest != s.Digest {
		return fmt.Errorf("snapshot %q is corrupted: digest %s, recorded %s: %w", id, digest, s.Digest, ErrCorrupt)
	}
	return nil
}

// DeleteSnapshot removes a snapshot no sandbox or other snapshot uses.
func (m *Manager) DeleteSnapshot(id string) error {
	s, err := m.GetSnapshot(id)
	if err != nil {
		return err
	}
	layer := s.Layers[0]
	m.mu.Lock()
	var users []string
	for _, l := range m.live {
		if l.rec.TemplateID == id || contains(l.rec.Layers, layer) {
			users = append(users, l.rec.ID)
		}
	}
	m.mu.Unlock()
	if len(users) > 0 {
		sort.Strings(users)
		return fmt.Errorf("snapshot %q is in use by sandbox(es) %s: %w", id, strings.Join(users, ", "), errdefs.ErrConflict)
	}
	all, err := m.ListSnapshots()
	if err != nil {
		return err
	}
	for _, o := range all {
		if o.ID != id && contains(o.Layers, layer) {
			return fmt.Errorf("snapshot %q is the base of snapshot %q: %w", id, o.ID, errdefs.ErrConflict)
		}
	}
	m.DrainPool(context.Background(), id)
	if err := m.cfg.Store.Delete(snapshotBucket, id); err != nil {
		return err
	}
	return os.RemoveAll(filepath.Join(m.snapshotRoot(), id))
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Rollback makes sandbox id's filesystem that of snapshot snapID: the
// sandbox restarts (same id, token, env) on the snapshot's layers with an
// empty writable layer. The snapshot must come from the same template.
func (m *Manager) Rollback(ctx context.Context, id, snapID string) (Sandbox, error) {
	s, err := m.GetSnapshot(snapID)
	if err != nil {
		return Sandbox{}, err
	}
	if !ValidID(id) {
		return Sandbox{}, fmt.Errorf("sandbox id %q: %w", id, errdefs.ErrInvalid)
	}
	defer m.ops.lock(id)()
	ctx = context.WithoutCancel(ctx)
	l, err := m.lookup(id)
	if err != nil {
		return Sandbox{}, err
	}
	m.mu.Lock()
	rec := l.rec
	m.mu.Unlock()
	if root := m.rootTemplate(rec); root != s.TemplateID {
		return rec, fmt.Errorf("snapshot %q is of template %q, sandbox %s runs %q: %w", snapID, s.TemplateID, id, root, errdefs.ErrInvalid)
	}
	if s.Runtime != rec.Runtime {
		return rec, fmt.Errorf("snapshot %q is of runtime %q, sandbox %s runs %q: %w", snapID, s.Runtime, id, rec.Runtime, errdefs.ErrInvalid)
	}
	tpl, err := m.templateFor(rec)
	if err != nil {
		return rec, err
	}
	start := time.Now()
	// End the current run: its writable layer is thrown away.
	m.releaseRunning(ctx, id)
	netCfg := NetworkConfig{}
	if rec.Network != nil {
		netCfg = *rec.Network
	}
	b, err := m.bootFrom(ctx, id, tpl, netCfg, &startFrom{resume: true, layers: s.Layers})
	if err != nil {
		// The sandbox cannot run any more: remove it rather than keep a
		// record of nothing.
		m.mu.Lock()
		delete(m.live, id)
		l.timer.Stop()
		m.mu.Unlock()
		m.cleanup(ctx, id)
		return rec, fmt.Errorf("rollback of sandbox %s failed; it was removed: %w", id, err)
	}
	ictx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	if err := b.agent.Init(ictx, agentInit(rec)); err != nil {
		return rec, err
	}
	m.removePaused(id)
	rec.Layers = s.Layers
	if rec.State == StatePaused {
		rec.EndAt = time.Now().UTC().Add(DefaultTimeout)
	}
	rec.State, rec.PausedAt = StateRunning, nil
	m.mu.Lock()
	l.rec, l.agent = rec, b.agent
	err = m.cfg.Store.Put(bucket, id, rec)
	m.armLocked(l)
	m.mu.Unlock()
	m.cfg.Log.Info("sandbox rolled back", "id", id, "snapshot", snapID, "took", time.Since(start).Round(time.Millisecond))
	return rec, err
}

// CloneResult is one clone's outcome.
type CloneResult struct {
	Sandbox Sandbox
	Err     error
}

// Clone makes count new sandboxes whose filesystem is a copy of sandbox
// id's now (its processes are frozen while it is copied, once). Each clone
// gets its own id and token, the source's env, metadata and lifecycle, and
// starts its template's start command.
func (m *Manager) Clone(ctx context.Context, id string, count int, timeout time.Duration) ([]CloneResult, error) {
	if count < 1 || count > 100 {
		return nil, fmt.Errorf("count must be 1..100: %w", errdefs.ErrInvalid)
	}
	if !ValidID(id) {
		return nil, fmt.Errorf("sandbox id %q: %w", id, errdefs.ErrInvalid)
	}
	ctx = context.WithoutCancel(ctx)
	if err := os.MkdirAll(m.snapshotRoot(), 0o711); err != nil {
		return nil, err
	}
	staging, err := os.MkdirTemp(m.snapshotRoot(), ".clone-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(staging)
	os.Chmod(staging, 0o711)
	layer := filepath.Join(staging, "layer")
	unlock := m.ops.lock(id)
	l, err := m.lookup(id)
	if err != nil {
		unlock()
		return nil, err
	}
	m.mu.Lock()
	rec := l.rec
	m.mu.Unlock()
	err = m.copyLayer(ctx, rec, layer)
	unlock()
	if err != nil {
		return nil, fmt.Errorf("clone sandbox %s: %w", id, err)
	}
	o := CreateOptions{
		Template: rec.TemplateID, Timeout: timeout, Metadata: rec.Metadata, EnvVars: rec.EnvVars,
		Lifecycle: rec.Lifecycle, from: &startFrom{upper: layer, layers: rec.Layers},
	}
	if rec.Network != nil {
		o.Network = *rec.Network
	}
	out := make([]CloneResult, 0, count)
	for i := 0; i < count; i++ {
		sb, err := m.Create(ctx, o)
		out = append(out, CloneResult{Sandbox: sb, Err: err})
	}
	return out, nil
}

// sweepSnapshots removes snapshot dirs without a record (half-written ones
// after a crash, clone staging).
func (m *Manager) sweepSnapshots() {
	entries, _ := os.ReadDir(m.snapshotRoot())
	for _, e := range entries {
		var s Snapshot
		if err := m.cfg.Store.Get(snapshotBucket, e.Name(), &s); err == nil {
			continue
		}
		m.cfg.Log.Warn("removing unfinished or unknown snapshot", "dir", e.Name())
		os.RemoveAll(filepath.Join(m.snapshotRoot(), e.Name()))
	}
}

// TreeDigest hashes a directory tree as overlayfs sees it: every entry's
// path, type, mode, owner, size, link target, device, overlay xattrs and
// file contents, in lexical order. It returns the digest, the total size
// of regular files and the number of entries.
func TreeDigest(root string) (digest string, size int64, files int, err error) {
	h := sha256.New()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		var uid, gid uint32
		var rdev uint64
		if st != nil {
			uid, gid, rdev = st.Uid, st.Gid, st.Rdev
		}
		fmt.Fprintf(h, "%q %o %d %d %d %d", rel, fi.Mode(), uid, gid, fi.Size(), rdev)
		for _, x := range []string{"trusted.overlay.opaque", "trusted.overlay.redirect", "user.overlay.opaque"} {
			buf := make([]byte, 256)
			if n, err := unix.Lgetxattr(path, x, buf); err == nil {
				fmt.Fprintf(h, " %s=%q", x, buf[:n])
			}
		}
		files++
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			t, err := os.Readlink(path)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, " -> %q", t)
		case fi.Mode().IsRegular():
			size += fi.Size()
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			fh := sha256.New()
			_, err = io.Copy(fh, f)
			f.Close()
			if err != nil {
				return err
			}
			fmt.Fprintf(h, " %x", fh.Sum(nil))
		}
		h.Write([]byte{'\n'})
		return nil
	})
	return hex.EncodeToString(h.Sum(nil)), size, files, err
}
