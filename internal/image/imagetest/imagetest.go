// Package imagetest builds OCI images in-process and serves them from an
// in-process registry, for nook's tests.
package imagetest

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Entry is one tar entry of a layer.
type Entry struct {
	Name     string
	Type     byte // tar.TypeReg when zero
	Body     string
	Mode     int64
	Linkname string
	UID, GID int
	Major    int64
	Xattrs   map[string]string
}

// TarBytes returns an uncompressed tar of entries.
func TarBytes(t testing.TB, entries []Entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.Name, Typeflag: e.Type, Mode: e.Mode, Linkname: e.Linkname,
			Uid: e.UID, Gid: e.GID, Devmajor: e.Major, ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.Body))
		}
		for k, v := range e.Xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(e.Body))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Layer returns a gzip layer of entries.
func Layer(t testing.TB, entries []Entry) v1.Layer {
	t.Helper()
	data := TarBytes(t, entries)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Image returns an image of layers (bottom first) with config cfg.
func Image(t testing.TB, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// BusyboxPath is the static busybox of the Debian package busybox-static.
const BusyboxPath = "/bin/busybox"

// BusyboxLayer is a root filesystem of a static busybox: /bin/busybox, the
// applets in names as symlinks, a /bin/bash stand-in that runs sh, /etc/passwd with root and
// user (1000), /etc/group, /tmp and /home/user. It skips t when the host
// has no static busybox.
func BusyboxLayer(t testing.TB, names ...string) v1.Layer {
	t.Helper()
	data, err := os.ReadFile(BusyboxPath)
	if err != nil {
		t.Skipf("no static busybox (apt-get install busybox-static): %v", err)
	}
	entries := []Entry{
		{Name: "bin/", Type: tar.TypeDir},
		{Name: "bin/busybox", Body: string(data), Mode: 0o755},
		{Name: "etc/", Type: tar.TypeDir},
		{Name: "etc/passwd", Body: "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n"},
		{Name: "etc/group", Body: "root:x:0:\nuser:x:1000:\n"},
		{Name: "tmp/", Type: tar.TypeDir, Mode: 0o1777},
		{Name: "root/", Type: tar.TypeDir, Mode: 0o700},
		{Name: "home/", Type: tar.TypeDir},
		{Name: "home/user/", Type: tar.TypeDir, UID: 1000, GID: 1000},
	}
	// nook sandbox run (like commands.run) uses /bin/bash; busybox has no
	// bash applet, so a stand-in runs its ash.
	entries = append(entries, Entry{Name: "bin/bash", Body: "#!/bin/sh\nexec /bin/sh \"$@\"\n", Mode: 0o755})
	for _, n := range names {
		entries = append(entries, Entry{Name: "bin/" + n, Type: tar.TypeSymlink, Linkname: "busybox"})
	}
	return Layer(t, entries)
}

// DefaultApplets are the busybox applets tests use.
var DefaultApplets = []string{"ls", "cat", "echo", "env", "id", "pwd", "mkdir", "rm", "sleep", "touch", "httpd", "test", "grep", "stat", "wc", "wget", "chown", "sh"}

// Registry is an in-process registry on loopback.
type Registry struct {
	Host string // 127.0.0.1:PORT
	srv  *httptest.Server
}

// Close stops the registry.
func (r *Registry) Close() { r.srv.Close() }

// ServeRegistry starts a registry on 127.0.0.1 that needs basic auth with
// user/pass when user is not empty.
func ServeRegistry(t testing.TB, user, pass string) *Registry {
	t.Helper()
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if user != "" {
			u, p, ok := r.BasicAuth()
			if !ok || u != user || p != pass {
				w.Header().Set("WWW-Authenticate", `Basic realm="nook-test"`)
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
				return
			}
		}
		reg.ServeHTTP(w, r)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	return &Registry{Host: strings.TrimPrefix(srv.URL, "http://"), srv: srv}
}

// Ref returns a reference to repo:tag on r.
func (r *Registry) Ref(t testing.TB, repoTag string) name.Reference {
	t.Helper()
	ref, err := name.ParseReference(r.Host + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}
