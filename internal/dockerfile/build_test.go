package dockerfile

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/nookhq/nook/internal/image"
)

func TestCopyAndCache(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (chown)")
	}
	ctxDir := t.TempDir()
	os.WriteFile(filepath.Join(ctxDir, "hello.txt"), []byte("hello"), 0o644)
	os.MkdirAll(filepath.Join(ctxDir, "sub", "deep"), 0o755)
	os.WriteFile(filepath.Join(ctxDir, "sub", "s.txt"), []byte("sub"), 0o600)
	os.WriteFile(filepath.Join(ctxDir, "sub", "deep", "d.txt"), []byte("deep"), 0o644)
	os.Symlink("/etc", filepath.Join(ctxDir, "out"))
	st, err := image.NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	instrs, err := Parse("FROM scratch\nWORKDIR /app\nCOPY hello.txt ./\nCOPY sub /app/sub/\nCOPY --chown=5:6 sub/s.txt /x\n")
	if err != nil {
		t.Fatal(err)
	}
	res, err := Build(context.Background(), instrs, ctxDir, Options{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	if res.Steps != 4 || res.Cached != 0 || len(res.Layers) != 4 {
		t.Fatalf("result %+v", res)
	}
	read := func(rel string) string {
		for _, l := range res.Layers {
			if b, err := os.ReadFile(filepath.Join(l, rel)); err == nil {
				return string(b)
			}
		}
		return "<missing>"
	}
	for rel, want := range map[string]string{"app/hello.txt": "hello", "app/sub/s.txt": "sub", "app/sub/deep/d.txt": "deep", "x": "sub"} {
		if got := read(rel); got != want {
			t.Errorf("%s: %q, want %q", rel, got, want)
		}
	}
	again, err := Build(context.Background(), instrs, ctxDir, Options{Store: st})
	if err != nil || again.Cached != 4 {
		t.Fatalf("rebuild: %+v %v", again, err)
	}
	// A symlinked directory of the context must not lead out of it.
	bad, _ := Parse("FROM scratch\nCOPY out/passwd /p\n")
	if _, err := Build(context.Background(), bad, ctxDir, Options{Store: st}); err == nil {
		t.Fatal("COPY through a symlink out of the context succeeded")
	}
	bad, _ = Parse("FROM scratch\nCOPY ../x /p\n")
	if _, err := Build(context.Background(), bad, ctxDir, Options{Store: st}); err == nil {
		t.Fatal("COPY ../x succeeded")
	}
}
