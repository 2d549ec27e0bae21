package pause

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// The backup bucket of these tests: an S3 server in this test process on
// 127.0.0.1, from memory. Every backup of the suite is copied to it.
const (
	s3Bucket = "nook-pause-backups"
	s3Access = "nook-test-access"
	s3Secret = "nook-test-secret-Zq81"
)

var (
	s3Backend *s3mem.Backend
	s3URL     string
)

func startFakeS3() (stop func()) {
	s3Backend = s3mem.New()
	s3Backend.CreateBucket(s3Bucket)
	ts := httptest.NewServer(gofakes3.New(s3Backend).Server())
	s3URL = ts.URL
	return ts.Close
}

func s3Args() []string {
	return []string{"--backup-s3-endpoint", s3URL, "--backup-s3-bucket", s3Bucket, "--backup-s3-region", "test-1"}
}

// The access key through NOOK_* like any flag; the secret only from the
// environment.
func s3Env() []string {
	return []string{"NOOK_BACKUP_S3_ACCESS_KEY=" + s3Access, "NOOK_BACKUP_S3_SECRET_KEY=" + s3Secret}
}

func s3Object(t *testing.T, key string) ([]byte, map[string]string) {
	t.Helper()
	obj, err := s3Backend.GetObject(s3Bucket, key, nil)
	if err != nil {
		if gofakes3.HasErrorCode(err, gofakes3.ErrNoSuchKey) {
			return nil, nil
		}
		t.Fatal(err)
	}
	defer obj.Contents.Close()
	data, _ := io.ReadAll(obj.Contents)
	return data, obj.Metadata
}

func TestBackupInS3(t *testing.T) {
	id := create(t, nil)
	run(t, id, "mkdir -p /work && echo s3-kept > /work/a.txt && head -c 200000 /dev/urandom > /work/blob")
	r := api(t, "POST", "/v1/sandboxes/"+id+"/backups", map[string]any{"dir": "/work"})
	want(t, r, http.StatusCreated, "backup")
	if strings.Contains(string(r.Body), s3Secret) || !strings.Contains(string(r.Body), s3URL+"/"+s3Bucket+"/") {
		t.Errorf("backup record: %s", r)
	}
	b := decodeBody[backupRec](t, r)
	t.Cleanup(func() { doErr("DELETE", apiURL+"/v1/backups/"+b.ID, nil, nil) })
	local := filepath.Join(dataDir, "backups", b.ID+".tar.gz")
	localData, err := os.ReadFile(local)
	if err != nil {
		t.Fatal(err)
	}
	obj, meta := s3Object(t, b.ID)
	if !bytes.Equal(obj, localData) || meta["X-Amz-Meta-Sha256"] != b.Digest {
		t.Fatalf("object in the bucket: %d bytes (local %d), metadata %v, digest %s", len(obj), len(localData), meta, b.Digest)
	}

	// Restore from the bucket when the local copy is gone.
	os.Remove(local)
	run(t, id, "rm -rf /work")
	want(t, api(t, "POST", "/v1/sandboxes/"+id+"/backups/"+b.ID+"/restore", map[string]any{}), http.StatusOK, "restore from the bucket")
	if got := run(t, id, "cat /work/a.txt; stat -c %s /work/blob"); got != "s3-kept\n200000\n" {
		t.Errorf("restored from the bucket: %q", got)
	}

	// A corrupted object is refused and nothing is written.
	obj[len(obj)/2] ^= 0xff
	s3Backend.PutObject(s3Bucket, b.ID, meta, bytes.NewReader(obj), int64(len(obj)), nil)
	os.Remove(local)
	run(t, id, "rm -rf /work")
	r = api(t, "POST", "/v1/sandboxes/"+id+"/backups/"+b.ID+"/restore", map[string]any{})
	if r.Status != http.StatusUnprocessableEntity || !strings.Contains(string(r.Body), "corrupted") {
		t.Fatalf("restore of a corrupted object: %s", r)
	}
	if out, _ := tryRun(id, "ls /work 2>&1"); !strings.Contains(out, "No such file") {
		t.Errorf("a refused restore wrote files: %q", out)
	}

	// Deleting the backup deletes the object.
	want(t, api(t, "DELETE", "/v1/backups/"+b.ID, nil), http.StatusNoContent, "delete backup")
	if obj, _ := s3Object(t, b.ID); obj != nil {
		t.Error("the object outlived its backup")
	}
	if log, _ := os.ReadFile(srv.LogPath); bytes.Contains(log, []byte(s3Secret)) {
		t.Error("nook serve logged the bucket's secret key")
	}
}

// E2B's Sandbox.deleteSnapshot is DELETE /templates/{snapshotID}.
func TestDeleteSnapshotThroughTemplates(t *testing.T) {
	id := create(t, nil)
	r := api(t, "POST", "/sandboxes/"+id+"/snapshots", map[string]string{})
	want(t, r, http.StatusCreated, "snapshot")
	snap := decodeBody[struct {
		SnapshotID string `json:"snapshotID"`
	}](t, r).SnapshotID
	t.Cleanup(func() { doErr("DELETE", apiURL+"/v1/snapshots/"+snap, nil, nil) })
	want(t, api(t, "DELETE", "/templates/"+snap, nil), http.StatusNoContent, "DELETE /templates/{snapshot}")
	want(t, api(t, "GET", "/v1/snapshots/"+snap, nil), http.StatusNotFound, "snapshot after its delete")
	// The SDK answers false on 404.
	want(t, api(t, "DELETE", "/templates/"+snap, nil), http.StatusNotFound, "second delete")
}
