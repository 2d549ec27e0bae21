package pause

import (
	"archive/tar"
	"compress/gzip"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

type backupRec struct {
	ID     string `json:"id"`
	Digest string `json:"digest"`
	Files  int    `json:"files"`
}

// archiveEntries lists a backup archive's entries and whether needle
// occurs anywhere in its (uncompressed) bytes.
func archiveEntries(t *testing.T, id, needle string) ([]string, bool) {
	t.Helper()
	f, err := os.Open(filepath.Join(dataDir, "backups", id+".tar.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var names []string
	found := false
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		data, _ := io.ReadAll(tr)
		if strings.Contains(string(data), needle) || strings.Contains(h.Name, needle) {
			found = true
		}
	}
	sort.Strings(names)
	return names, found
}

func TestBackupRestoreWithExcludes(t *testing.T) {
	src := create(t, nil)
	run(t, src, `set -e; cd /home/user; mkdir -p proj/src proj/node_modules/dep proj/build
echo code > proj/src/main.go; echo dep > proj/node_modules/dep/i.js; echo out > proj/build/x.o
echo log > proj/debug.log; printf '*.log\n/build/\n' > proj/.gitignore; ln -s /etc/passwd proj/link
chown -R user:user proj`)
	r := api(t, "POST", "/v1/sandboxes/"+src+"/backups", map[string]any{
		"dir": "/home/user/proj", "name": "proj", "ttl": 3600, "excludes": []string{"node_modules"}, "gitignore": true,
	})
	want(t, r, http.StatusCreated, "create backup")
	b := decodeBody[backupRec](t, r)
	t.Cleanup(func() { doErr("DELETE", apiURL+"/v1/backups/"+b.ID, nil, nil) })
	names, _ := archiveEntries(t, b.ID, "\x00never")
	if got := strings.Join(names, " "); got != ".gitignore link src/ src/main.go" {
		t.Errorf("archive entries: %s", got)
	}
	// Restore into another sandbox, at another dir, and into the source.
	dst := create(t, nil)
	want(t, api(t, "POST", "/v1/sandboxes/"+dst+"/backups/"+b.ID+"/restore", map[string]string{"dir": "/srv/copy"}), http.StatusOK, "restore into another sandbox")
	if got := run(t, dst, "cat /srv/copy/src/main.go; stat -c %U /srv/copy/src/main.go; readlink /srv/copy/link; test ! -e /srv/copy/node_modules && echo no-deps"); got != "code\nuser\n/etc/passwd\nno-deps\n" {
		t.Errorf("restored copy: %q", got)
	}
	run(t, src, "rm -rf /home/user/proj/src")
	want(t, api(t, "POST", "/v1/sandboxes/"+src+"/backups/"+b.ID+"/restore", map[string]any{}), http.StatusOK, "restore in place")
	if got := run(t, src, "cat /home/user/proj/src/main.go"); got != "code\n" {
		t.Errorf("restored in place: %q", got)
	}
	// The symlink in the archive never leads the restore out of the sandbox.
	hostPasswd, _ := os.ReadFile("/etc/passwd")
	if strings.Contains(string(hostPasswd), "main.go") {
		t.Errorf("restore wrote through a symlink onto the host")
	}
}

func TestBackupHasNoStoredEnv(t *testing.T) {
	const name, value = "NOOK_BACKUP_SECRET_NAME_Q7", "value-that-must-not-leak-9f2"
	id := create(t, map[string]any{"envVars": map[string]string{name: value}})
	if got := run(t, id, "echo $"+name); got != value+"\n" {
		t.Fatalf("env not set: %q", got)
	}
	run(t, id, "echo data > /root/file")
	r := api(t, "POST", "/v1/sandboxes/"+id+"/backups", map[string]any{
		"dir": "/", "excludes": []string{"/usr", "/var", "/lib", "/lib64", "/bin", "/sbin", "/boot", "/opt"},
	})
	want(t, r, http.StatusCreated, "backup of /")
	b := decodeBody[backupRec](t, r)
	t.Cleanup(func() { doErr("DELETE", apiURL+"/v1/backups/"+b.ID, nil, nil) })
	names, leaked := archiveEntries(t, b.ID, name)
	if leaked {
		t.Errorf("the backup contains the stored env name %s", name)
	}
	if _, leaked := archiveEntries(t, b.ID, value); leaked {
		t.Errorf("the backup contains the stored env value")
	}
	if !strings.Contains(strings.Join(names, " "), "root/file") {
		t.Errorf("backup of / lacks root/file: %v", names)
	}
}

func TestCorruptedBackupRefused(t *testing.T) {
	id := create(t, nil)
	run(t, id, "mkdir -p /data && head -c 100000 /dev/urandom > /data/blob")
	r := api(t, "POST", "/v1/sandboxes/"+id+"/backups", map[string]any{"dir": "/data"})
	want(t, r, http.StatusCreated, "backup")
	b := decodeBody[backupRec](t, r)
	t.Cleanup(func() { doErr("DELETE", apiURL+"/v1/backups/"+b.ID, nil, nil) })
	want(t, api(t, "GET", "/v1/backups/"+b.ID+"?verify=true", nil), http.StatusOK, "verify a good backup")
	path := filepath.Join(dataDir, "backups", b.ID+".tar.gz")
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	f.ReadAt(buf, 5000)
	buf[0] ^= 0xff
	f.WriteAt(buf, 5000)
	f.Close()
	run(t, id, "rm -rf /data")
	r = api(t, "POST", "/v1/sandboxes/"+id+"/backups/"+b.ID+"/restore", map[string]any{})
	if r.Status != http.StatusUnprocessableEntity || !strings.Contains(string(r.Body), "corrupted") {
		t.Fatalf("restore of a corrupted archive: %s", r)
	}
	if out, _ := tryRun(id, "ls /data 2>&1"); !strings.Contains(out, "No such file") {
		t.Errorf("a refused restore wrote files: %q", out)
	}
}

func TestBackupTTLExpires(t *testing.T) {
	id := create(t, nil)
	r := api(t, "POST", "/v1/sandboxes/"+id+"/backups", map[string]any{"dir": "/etc/apt", "ttl": 1})
	want(t, r, http.StatusCreated, "backup")
	b := decodeBody[backupRec](t, r)
	waitGone := func() bool {
		return api(t, "GET", "/v1/backups/"+b.ID, nil).Status == http.StatusNotFound
	}
	for i := 0; i < 20 && !waitGone(); i++ {
		sleep(250)
	}
	if !waitGone() {
		t.Fatalf("expired backup is still offered")
	}
}
