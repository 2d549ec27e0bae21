package backupstore

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// fakeS3 serves the S3 protocol in-process on 127.0.0.1 (over TLS) with an
// in-memory backend holding bucket; it returns the store's config.
//
// TLS, because over plain http minio-go signs multipart uploads' parts as
// aws-chunked streams, which gofakes3 decodes for single PUTs but not for
// parts (real S3 servers decode both); TestS3HTTP covers plain http.
func fakeS3(t *testing.T, bucket string) (S3Config, *s3mem.Backend) {
	t.Helper()
	be := s3mem.New()
	if bucket != "" {
		if err := be.CreateBucket(bucket); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewTLSServer(gofakes3.New(be).Server())
	t.Cleanup(srv.Close)
	return S3Config{Endpoint: srv.URL, Bucket: bucket, Region: "eu-test-1", AccessKey: "AKID", SecretKey: "s3cr3t", Transport: srv.Client().Transport}, be
}

func testStore(t *testing.T, s Store) {
	ctx := context.Background()
	if _, err := s.Get(ctx, "bk-missing"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of a missing key: %v, want ErrNotFound", err)
	}
	data := bytes.Repeat([]byte("nook backup "), 3<<20/12)
	if err := s.Put(ctx, "bk-one", bytes.NewReader(data), int64(len(data)), "abc123"); err != nil {
		t.Fatal(err)
	}
	rc, err := s.Get(ctx, "bk-one")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("Get: %d bytes (err %v), want the %d put", len(got), err, len(data))
	}
	// Replace.
	if err := s.Put(ctx, "bk-one", strings.NewReader("v2"), 2, "d2"); err != nil {
		t.Fatal(err)
	}
	rc, err = s.Get(ctx, "bk-one")
	if err != nil {
		t.Fatal(err)
	}
	got, _ = io.ReadAll(rc)
	rc.Close()
	if string(got) != "v2" {
		t.Fatalf("after a second Put: %q", got)
	}
	if err := s.Delete(ctx, "bk-one"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "bk-one"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after Delete: %v, want ErrNotFound", err)
	}
	if err := s.Delete(ctx, "bk-one"); err != nil {
		t.Fatalf("Delete of a missing key: %v", err)
	}
	for _, bad := range []string{"", "../x", "a/b", ".."} {
		if err := s.Put(ctx, bad, strings.NewReader("x"), 1, ""); err == nil {
			t.Errorf("Put accepted key %q", bad)
		}
	}
}

func TestDir(t *testing.T) {
	d := Dir{Path: filepath.Join(t.TempDir(), "backups"), Suffix: ".tar.gz"}
	testStore(t, d)
	// A short read is not committed and leaves no temporary file.
	if err := d.Put(context.Background(), "bk-short", strings.NewReader("abc"), 10, ""); err == nil {
		t.Fatal("a short Put succeeded")
	}
	if _, err := os.Stat(d.File("bk-short")); !os.IsNotExist(err) {
		t.Fatalf("short Put left %s: %v", d.File("bk-short"), err)
	}
	if _, err := os.Stat(d.Temp("bk-short")); !os.IsNotExist(err) {
		t.Fatalf("short Put left its temporary file: %v", err)
	}
}

func TestS3(t *testing.T) {
	cfg, be := fakeS3(t, "nook-backups")
	s, err := NewS3(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	testStore(t, s)

	// The digest is kept in the object's metadata.
	ctx := context.Background()
	if err := s.Put(ctx, "bk-meta", strings.NewReader("hello"), 5, "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"); err != nil {
		t.Fatal(err)
	}
	if d, err := s.Digest(ctx, "bk-meta"); err != nil || d != "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824" {
		t.Fatalf("Digest: %q, %v", d, err)
	}
	obj, err := be.HeadObject("nook-backups", "bk-meta")
	if err != nil {
		t.Fatal(err)
	}
	if obj.Metadata["X-Amz-Meta-Sha256"] == "" {
		t.Errorf("object metadata %v lacks X-Amz-Meta-Sha256", obj.Metadata)
	}
	// An upload larger than one part (multipart) round-trips.
	big := bytes.Repeat([]byte{7}, 17<<20)
	if err := s.Put(ctx, "bk-big", bytes.NewReader(big), int64(len(big)), "x"); err != nil {
		t.Fatal(err)
	}
	rc, err := s.Get(ctx, "bk-big")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("multipart object: %d bytes back, err %v", len(got), err)
	}
}

func TestS3HTTP(t *testing.T) {
	be := s3mem.New()
	be.CreateBucket("plain")
	srv := httptest.NewServer(gofakes3.New(be).Server())
	defer srv.Close()
	s, err := NewS3(S3Config{Endpoint: srv.URL, Bucket: "plain", AccessKey: "a", SecretKey: "b"})
	if err != nil {
		t.Fatal(err)
	}
	testStore(t, s)
}

func TestS3Config(t *testing.T) {
	cfg, _ := fakeS3(t, "")
	cfg.Bucket = "absent"
	s, err := NewS3(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(context.Background()); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("Check of a missing bucket: %v", err)
	}
	if strings.Contains(s.String(), cfg.SecretKey) || strings.Contains(s.String(), cfg.AccessKey) {
		t.Fatalf("String() shows a key: %s", s)
	}
	// Wrong credentials are refused by the server (gofakes3 checks no
	// signatures, so only the shape of the config is checked here).
	for _, c := range []S3Config{
		{Endpoint: "", Bucket: "b"},
		{Endpoint: "http://h:1", Bucket: ""},
		{Endpoint: "ftp://h", Bucket: "b"},
		{Endpoint: "http://h:1/b", Bucket: "b"},
		{Endpoint: "http://h:1", Bucket: "b", AccessKey: "only"},
	} {
		if _, err := NewS3(c); err == nil {
			t.Errorf("NewS3(%+v) accepted", c)
		}
	}
	for ep, want := range map[string]string{
		"s3.example.com":        "https://s3.example.com/b",
		"http://127.0.0.1:9000": "http://127.0.0.1:9000/b",
		"https://x.y:8443/":     "https://x.y:8443/b",
	} {
		s, err := NewS3(S3Config{Endpoint: ep, Bucket: "b"})
		if err != nil || s.String() != want {
			t.Errorf("endpoint %q: %v %v, want %s", ep, s, err, want)
		}
	}
}
