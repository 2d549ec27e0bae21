package image_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/image"
	it "github.com/nookhq/nook/internal/image/imagetest"
	"github.com/nookhq/nook/internal/runtime"
)

func needRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (chown, mknod, trusted xattrs)")
	}
}

func stat(t *testing.T, p string) *syscall.Stat_t {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t)
}

func TestUnpackFeatures(t *testing.T) {
	needRoot(t)
	dest := filepath.Join(t.TempDir(), "l")
	data := it.TarBytes(t, []it.Entry{
		{Name: "./", Type: tar.TypeDir},
		{Name: "etc/", Type: tar.TypeDir},
		{Name: "etc/conf", Body: "x", Mode: 0o640, UID: 1000, GID: 1001},
		{Name: "bin/su", Body: "su", Mode: 0o4755},
		{Name: "etc/hard", Type: tar.TypeLink, Linkname: "etc/conf"},
		{Name: "etc/abs", Type: tar.TypeSymlink, Linkname: "/etc/passwd"},
		{Name: "etc/.wh.gone", Body: ""},
		{Name: "opt/.wh..wh..opq", Body: ""},
		{Name: "opt/keep", Body: "k"},
		{Name: "deep/a/b/c", Body: "c"},
		{Name: "fifo", Type: tar.TypeFifo},
		{Name: "x", Body: "x", Xattrs: map[string]string{"user.k": "v", "trusted.overlay.redirect": "/etc"}},
	})
	if err := image.Unpack(bytes.NewReader(data), dest); err != nil {
		t.Fatal(err)
	}
	base := uint32(runtime.HostUIDBase)
	if st := stat(t, filepath.Join(dest, "etc/conf")); st.Uid != base+1000 || st.Gid != base+1001 || st.Mode&0o7777 != 0o640 || st.Nlink != 2 {
		t.Errorf("etc/conf: uid %d gid %d mode %o nlink %d", st.Uid, st.Gid, st.Mode&0o7777, st.Nlink)
	}
	if st := stat(t, filepath.Join(dest, "bin/su")); st.Mode&0o7777 != 0o4755 || st.Uid != base {
		t.Errorf("bin/su mode %o uid %d", st.Mode&0o7777, st.Uid)
	}
	if l, _ := os.Readlink(filepath.Join(dest, "etc/abs")); l != "/etc/passwd" {
		t.Errorf("symlink target %q", l)
	}
	if st := stat(t, filepath.Join(dest, "etc/gone")); st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("whiteout: mode %o rdev %d", st.Mode, st.Rdev)
	}
	buf := make([]byte, 8)
	if n, err := unix.Lgetxattr(filepath.Join(dest, "opt"), image.OpaqueXattr, buf); err != nil || string(buf[:n]) != "y" {
		t.Errorf("opaque xattr: %q %v", buf[:n], err)
	}
	if _, err := os.Stat(filepath.Join(dest, "opt/.wh..wh..opq")); err == nil {
		t.Error("opaque marker left as a file")
	}
	if n, err := unix.Lgetxattr(filepath.Join(dest, "x"), "user.k", buf); err != nil || string(buf[:n]) != "v" {
		t.Errorf("user xattr: %q %v", buf[:n], err)
	}
	if _, err := unix.Lgetxattr(filepath.Join(dest, "x"), "trusted.overlay.redirect", buf); err == nil {
		t.Error("a trusted.overlay xattr from the layer was applied")
	}
	if st := stat(t, dest); st.Uid != base || st.Mode&0o777 != 0o755 {
		t.Errorf("root uid %d mode %o", st.Uid, st.Mode&0o777)
	}
}

func TestUnpackRefusesHostile(t *testing.T) {
	needRoot(t)
	cases := map[string][]it.Entry{
		"dotdot":       {{Name: "a/../../escape", Body: "x"}},
		"absolute":     {{Name: "/etc/evil", Body: "x"}},
		"symlink-out":  {{Name: "evil", Type: tar.TypeSymlink, Linkname: "/etc"}, {Name: "evil/passwd", Body: "x"}},
		"symlink-rel":  {{Name: "evil", Type: tar.TypeSymlink, Linkname: "../../.."}, {Name: "evil/x", Body: "x"}},
		"hardlink-out": {{Name: "h", Type: tar.TypeLink, Linkname: "../../etc/passwd"}},
		"hardlink-through-symlink": {{Name: "s", Type: tar.TypeSymlink, Linkname: "/etc"},
			{Name: "h", Type: tar.TypeLink, Linkname: "s/passwd"}},
		"char-device":  {{Name: "dev/mem", Type: tar.TypeChar, Major: 1}},
		"block-device": {{Name: "sda", Type: tar.TypeBlock, Major: 8}},
		"big-uid":      {{Name: "f", Body: "x", UID: 70000}},
	}
	for name, entries := range cases {
		t.Run(name, func(t *testing.T) {
			parent := t.TempDir()
			dest := filepath.Join(parent, "l")
			err := image.Unpack(bytes.NewReader(it.TarBytes(t, entries)), dest)
			if err == nil {
				t.Fatal("unpacked a hostile layer")
			}
			if name != "big-uid" && !errors.Is(err, image.ErrHostile) {
				t.Errorf("error does not wrap ErrHostile: %v", err)
			}
			t.Log(err)
			if _, serr := os.Lstat(dest); serr == nil {
				t.Error("the refused layer left its directory behind")
			}
		})
	}
	if _, err := os.Stat("/etc/evil"); err == nil {
		t.Fatal("/etc/evil was written")
	}
}

func busyboxImage(t *testing.T) v1.Image {
	return it.Image(t, v1.Config{Env: []string{"PATH=/bin", "A=1"}, Cmd: []string{"/bin/sh"}, WorkingDir: "/tmp", User: "1000",
		ExposedPorts: map[string]struct{}{"8080/tcp": {}}},
		it.BusyboxLayer(t, it.DefaultApplets...),
		it.Layer(t, []it.Entry{{Name: "tmp/.wh.nothing"}, {Name: "hello", Body: "hi"}}))
}

func TestSourcesAndStore(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	img := busyboxImage(t)
	dir := t.TempDir()
	st, err := image.NewStore(dir)
	if err != nil {
		t.Fatal(err)
	}

	reg := it.ServeRegistry(t, "alice", "s3cret")
	defer reg.Close()
	ref := reg.Ref(t, "test/busybox:1")
	if err := remote.Write(ref, img, remote.WithAuth(basic("alice", "s3cret"))); err != nil {
		t.Fatal(err)
	}
	// Wrong password: a clear error.
	_, err = image.Open(ctx, ref.String(), image.Auth{Username: "alice", Password: "wrong"}, st.TmpDir())
	if err == nil || !strings.Contains(err.Error(), "refused the credentials") {
		t.Fatalf("wrong password: %v", err)
	}
	src, err := image.Open(ctx, ref.String(), image.Auth{Username: "alice", Password: "s3cret"}, st.TmpDir())
	if err != nil {
		t.Fatal(err)
	}
	var fresh, cached int
	layers, err := st.Pull(ctx, src.Image, func(p image.Progress) {
		if p.Done && p.Cached {
			cached++
		} else if p.Done {
			fresh++
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 2 || fresh != 2 || cached != 0 {
		t.Fatalf("layers %v fresh %d cached %d", layers, fresh, cached)
	}
	if data, _ := os.ReadFile(filepath.Join(layers[0], "hello")); string(data) != "hi" {
		t.Fatalf("topmost layer is not first: %v", layers)
	}
	cfg, err := image.ConfigOf(src.Image)
	if err != nil || cfg.WorkingDir != "/tmp" || cfg.User != "1000" || len(cfg.ExposedPorts) != 1 || cfg.ExposedPorts[0] != 8080 {
		t.Fatalf("config %+v %v", cfg, err)
	}

	// OCI layout (inside a multi-arch index), OCI archive, docker archive:
	// the same layers, found in the store.
	arm := it.Image(t, v1.Config{}, it.Layer(t, []it.Entry{{Name: "arm", Body: "arm"}}))
	armCF, _ := arm.ConfigFile()
	armCF = armCF.DeepCopy()
	armCF.Architecture = "arm64"
	arm, _ = mutate.ConfigFile(arm, armCF)
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}})
	lp, err := layout.Write(filepath.Join(dir, "oci"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendIndex(idx); err != nil {
		t.Fatal(err)
	}
	dockerTar := filepath.Join(dir, "img.tar")
	if err := tarball.WriteToFile(dockerTar, ref, img); err != nil {
		t.Fatal(err)
	}
	ociTar := filepath.Join(dir, "oci.tar")
	if err := tarDir(filepath.Join(dir, "oci"), ociTar); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"oci-layout:" + filepath.Join(dir, "oci"), "oci-archive:" + ociTar, "docker-archive:" + dockerTar} {
		src, err := image.Open(ctx, s, image.Auth{}, st.TmpDir())
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		fresh, cached = 0, 0
		got, err := st.Pull(ctx, src.Image, func(p image.Progress) {
			if p.Done && p.Cached {
				cached++
			}
		})
		src.Close()
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		if strings.Join(got, ",") != strings.Join(layers, ",") || cached != 2 {
			t.Fatalf("%s: layers %v (want %v), cached %d", s, got, layers, cached)
		}
	}
	if entries, _ := os.ReadDir(st.TmpDir()); len(entries) != 0 {
		t.Fatalf("tmp dir not empty: %v", entries)
	}
}

func TestPullRefusesHostileLayer(t *testing.T) {
	needRoot(t)
	st, _ := image.NewStore(t.TempDir())
	img := it.Image(t, v1.Config{}, it.Layer(t, []it.Entry{{Name: "ok", Body: "x"}}),
		it.Layer(t, []it.Entry{{Name: "evil", Type: tar.TypeSymlink, Linkname: "/etc"}, {Name: "evil/passwd", Body: "x"}}))
	_, err := st.Pull(context.Background(), img, nil)
	if !errors.Is(err, image.ErrHostile) || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("err %v", err)
	}
	entries, _ := os.ReadDir(st.TmpDir())
	if len(entries) != 0 {
		t.Fatalf("left behind: %v", entries)
	}
}
