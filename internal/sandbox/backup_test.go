package sandbox

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"

	"github.com/nookhq/nook/internal/agentclient"
	"github.com/nookhq/nook/internal/backupstore"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/runtime"
	"github.com/nookhq/nook/internal/store"
	"github.com/nookhq/nook/internal/template"
)

func TestIgnorer(t *testing.T) {
	ig, err := newIgnorer([]string{"node_modules", "*.log", "/build/", "!keep.log", "docs/**/*.tmp"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		dir  bool
		want bool
	}{
		{"node_modules", true, true},
		{"a/b/node_modules", true, true},
		{"x.log", false, true},
		{"src/y.log", false, true},
		{"keep.log", false, false},
		{"build", true, true},
		{"build", false, false},
		{"src/build", true, false},
		{"docs/a/b/c.tmp", false, true},
		{"docs/c.tmp", false, true},
		{"src/main.go", false, false},
	} {
		if got := ig.match(c.path, c.dir); got != c.want {
			t.Errorf("match(%q, dir=%v) = %v, want %v", c.path, c.dir, got, c.want)
		}
	}
	if _, err := newIgnorer([]string{"[bad"}); err == nil {
		t.Error("a malformed pattern was accepted")
	}
}

// pauserRuntime is fakeRuntime (pool_test.go) with a sandbox's root as a
// plain directory, so that backups can read and write it.
type pauserRuntime struct {
	*fakeRuntime
	roots string
}

func (p *pauserRuntime) RootPath(id string) string { return filepath.Join(p.roots, id) }
func (p *pauserRuntime) Freeze(context.Context, string, bool) error {
	return nil
}
func (p *pauserRuntime) Pause(context.Context, string, string, bool) (bool, error) {
	return false, errors.New("not in this test")
}
func (p *pauserRuntime) Restore(context.Context, runtime.Spec, string) error {
	return errors.New("not in this test")
}
func (p *pauserRuntime) CopyLayer(context.Context, string, string) error {
	return errors.New("not in this test")
}

// fakeBucket serves the S3 protocol in-process on 127.0.0.1 from memory.
type fakeBucket struct {
	srv   *httptest.Server
	be    *s3mem.Backend
	store *backupstore.S3
}

const testBucket = "nook-backups"

func newFakeBucket(t *testing.T) *fakeBucket {
	t.Helper()
	be := s3mem.New()
	if err := be.CreateBucket(testBucket); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gofakes3.New(be).Server())
	t.Cleanup(srv.Close)
	s, err := backupstore.NewS3(backupstore.S3Config{Endpoint: srv.URL, Bucket: testBucket, AccessKey: "AKID", SecretKey: "s3cr3t-never-shown", MaxRetries: 1})
	if err != nil {
		t.Fatal(err)
	}
	return &fakeBucket{srv: srv, be: be, store: s}
}

// object returns the bucket's object of key, nil when there is none.
func (f *fakeBucket) object(t *testing.T, key string) (data []byte, meta map[string]string) {
	t.Helper()
	obj, err := f.be.GetObject(testBucket, key, nil)
	if err != nil {
		if gofakes3.HasErrorCode(err, gofakes3.ErrNoSuchKey) {
			return nil, nil
		}
		t.Fatal(err)
	}
	defer obj.Contents.Close()
	data, err = io.ReadAll(obj.Contents)
	if err != nil {
		t.Fatal(err)
	}
	return data, obj.Metadata
}

// newBackupManager is a manager whose sandboxes' roots are directories,
// with bucket as its backup bucket (when not nil), and one sandbox.
func newBackupManager(t *testing.T, bucket backupstore.Store) (*Manager, string, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root: restores give files the sandbox's owners")
	}
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	reg, err := template.NewRegistry(st, dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Put(template.Template{ID: "base", State: template.StateReady, Layers: []string{dir}, DiskMB: 16}); err != nil {
		t.Fatal(err)
	}
	agent := filepath.Join(dir, "agent")
	os.WriteFile(agent, nil, 0o755)
	rt := &pauserRuntime{
		fakeRuntime: &fakeRuntime{runDir: filepath.Join(dir, "run"), servers: map[string]*http.Server{}, inits: map[string][]agentclient.InitRequest{}},
		roots:       filepath.Join(dir, "roots"),
	}
	m, err := NewManager(Config{
		DataDir: dir, AgentPath: agent, Runtime: rt, Store: st, Templates: reg,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), BackupRemote: bucket,
	})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := m.Create(context.Background(), CreateOptions{Template: "base", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Kill(context.Background(), sb.ID) })
	root := rt.RootPath(sb.ID)
	if err := os.MkdirAll(filepath.Join(root, "data", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(root, "data", "a.txt"), []byte("alpha\n"), 0o644)
	os.WriteFile(filepath.Join(root, "data", "sub", "b.bin"), bytes.Repeat([]byte{1, 2, 3}, 50000), 0o600)
	os.WriteFile(filepath.Join(root, "data", "skip.log"), []byte("log\n"), 0o644)
	uid := runtime.HostUIDBase + 1000
	for _, p := range []string{"data", "data/a.txt", "data/sub", "data/sub/b.bin"} {
		os.Lchown(filepath.Join(root, p), uid, uid)
	}
	return m, sb.ID, root
}

func TestBackupCopiedToS3AndRestoredFromIt(t *testing.T) {
	bucket := newFakeBucket(t)
	m, id, root := newBackupManager(t, bucket.store)
	ctx := context.Background()
	b, err := m.CreateBackup(ctx, id, BackupOptions{Dir: "/data", Excludes: []string{"*.log"}})
	if err != nil {
		t.Fatal(err)
	}
	if b.Remote != bucket.srv.URL+"/"+testBucket+"/"+b.ID {
		t.Errorf("record's remote: %q", b.Remote)
	}
	local, err := os.ReadFile(m.backupPath(b.ID))
	if err != nil {
		t.Fatal("no local copy:", err)
	}
	obj, meta := bucket.object(t, b.ID)
	if !bytes.Equal(obj, local) {
		t.Fatalf("object in the bucket (%d bytes) differs from the local archive (%d bytes)", len(obj), len(local))
	}
	if meta["X-Amz-Meta-Sha256"] != b.Digest {
		t.Errorf("object metadata %v: want X-Amz-Meta-Sha256 = %s", meta, b.Digest)
	}
	if err := m.VerifyBackup(ctx, b); err != nil {
		t.Fatal(err)
	}

	// The local copy is gone: restore reads the bucket's, checks it and
	// keeps it locally again.
	os.Remove(m.backupPath(b.ID))
	os.RemoveAll(filepath.Join(root, "data"))
	if _, err := m.RestoreBackup(ctx, b.ID, id, "/restored"); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(root, "restored", "a.txt")); string(got) != "alpha\n" {
		t.Errorf("restored a.txt: %q", got)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(root, "restored", "sub", "b.bin"), &st); err != nil || st.Size != 150000 || st.Uid != runtime.HostUIDBase+1000 || st.Mode&0o777 != 0o600 {
		t.Errorf("restored b.bin: %+v, %v", st, err)
	}
	if _, err := os.Stat(filepath.Join(root, "restored", "skip.log")); !os.IsNotExist(err) {
		t.Errorf("excluded file restored: %v", err)
	}
	if again, err := os.ReadFile(m.backupPath(b.ID)); err != nil || !bytes.Equal(again, local) {
		t.Errorf("the fetched archive was not kept locally: %v", err)
	}

	// Delete removes the object too.
	if err := m.DeleteBackup(b.ID); err != nil {
		t.Fatal(err)
	}
	if obj, _ := bucket.object(t, b.ID); obj != nil {
		t.Error("the object outlived its backup")
	}
	if _, err := os.Stat(m.backupPath(b.ID)); !os.IsNotExist(err) {
		t.Errorf("local archive outlived its backup: %v", err)
	}
}

func TestBackupCorruptedInS3Refused(t *testing.T) {
	bucket := newFakeBucket(t)
	m, id, root := newBackupManager(t, bucket.store)
	ctx := context.Background()
	b, err := m.CreateBackup(ctx, id, BackupOptions{Dir: "/data"})
	if err != nil {
		t.Fatal(err)
	}
	obj, meta := bucket.object(t, b.ID)
	obj[len(obj)/2] ^= 0xff
	if _, err := bucket.be.PutObject(testBucket, b.ID, meta, bytes.NewReader(obj), int64(len(obj)), nil); err != nil {
		t.Fatal(err)
	}
	// With the local copy there, verify still finds the bucket's bad.
	if err := m.VerifyBackup(ctx, b); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "backup bucket") {
		t.Fatalf("verify with a corrupted object: %v", err)
	}
	os.Remove(m.backupPath(b.ID))
	_, err = m.RestoreBackup(ctx, b.ID, id, "/restored")
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "corrupted") {
		t.Fatalf("restore of a corrupted object: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "restored")); !os.IsNotExist(err) {
		t.Errorf("a refused restore wrote into the sandbox: %v", err)
	}
	entries, _ := os.ReadDir(m.backupRoot())
	if len(entries) != 0 {
		t.Errorf("a refused download left files: %v", entries)
	}
	// Gone from both: a clear error, not a crash.
	bucket.be.DeleteObject(testBucket, b.ID)
	if _, err := m.RestoreBackup(ctx, b.ID, id, ""); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("restore of a backup gone everywhere: %v", err)
	}
}

func TestBackupS3ExpiryAndOutage(t *testing.T) {
	bucket := newFakeBucket(t)
	m, id, _ := newBackupManager(t, bucket.store)
	ctx := context.Background()
	short, err := m.CreateBackup(ctx, id, BackupOptions{Dir: "/data", TTL: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	kept, err := m.CreateBackup(ctx, id, BackupOptions{Dir: "/data"})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	m.sweepBackupsOnce(false)
	if obj, _ := bucket.object(t, short.ID); obj != nil {
		t.Error("an expired backup's object is still in the bucket")
	}
	if obj, _ := bucket.object(t, kept.ID); obj == nil {
		t.Error("the sweep deleted a live backup's object")
	}

	// The bucket is down: a delete fails (503) and keeps the backup; a new
	// backup fails and keeps nothing.
	bucket.srv.Close()
	if err := m.DeleteBackup(kept.ID); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("delete while the bucket is down: %v", err)
	}
	if _, err := m.GetBackup(kept.ID); err != nil {
		t.Fatalf("a failed delete lost the backup: %v", err)
	}
	if _, err := m.CreateBackup(ctx, id, BackupOptions{Dir: "/data"}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("backup while the bucket is down: %v", err)
	}
	list, _ := m.ListBackups("")
	entries, _ := os.ReadDir(m.backupRoot())
	if len(list) != 1 || len(entries) != 1 {
		t.Fatalf("after a failed backup: %d records, %d files, want 1 and 1", len(list), len(entries))
	}
}

func TestBackupLocalOnly(t *testing.T) {
	m, id, root := newBackupManager(t, nil)
	ctx := context.Background()
	b, err := m.CreateBackup(ctx, id, BackupOptions{Dir: "/data"})
	if err != nil {
		t.Fatal(err)
	}
	if b.Remote != "" {
		t.Errorf("remote %q without a bucket", b.Remote)
	}
	if _, err := m.RestoreBackup(ctx, b.ID, id, "/copy"); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(root, "copy", "a.txt")); string(got) != "alpha\n" {
		t.Errorf("restored a.txt: %q", got)
	}
	f, _ := os.OpenFile(m.backupPath(b.ID), os.O_RDWR, 0)
	one := make([]byte, 1)
	f.ReadAt(one, b.SizeBytes/2)
	one[0] ^= 0xff
	f.WriteAt(one, b.SizeBytes/2)
	f.Close()
	if _, err := m.RestoreBackup(ctx, b.ID, id, "/copy2"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("restore of a corrupted archive: %v", err)
	}
	if _, err := m.CreateBackup(ctx, id, BackupOptions{Dir: "/nope"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("backup of a missing dir: %v", err)
	}
	if entries, _ := os.ReadDir(m.backupRoot()); len(entries) != 1 {
		t.Errorf("a failed backup left files: %v", entries)
	}
}
