package image

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

// Store keeps unpacked layers under DATA/layers: sha256/<diffID hex>/ for
// image layers (shared by every template that uses them), build/<key>/ for
// layers made by Dockerfile steps, tmp/ for unpacks in progress.
type Store struct {
	Dir string
}

// NewStore returns the layer store of dataDir.
func NewStore(dataDir string) (*Store, error) {
	s := &Store{Dir: filepath.Join(dataDir, "layers")}
	for _, d := range []string{s.Dir, filepath.Join(s.Dir, "sha256"), filepath.Join(s.Dir, "build"), s.TmpDir()} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, err
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// TmpDir is where unpacks and builds in progress live (same file system as
// the layers, so a finished one is renamed into place).
func (s *Store) TmpDir() string { return filepath.Join(s.Dir, "tmp") }

// CleanTmp removes what interrupted unpacks left.
func (s *Store) CleanTmp() error {
	entries, err := os.ReadDir(s.TmpDir())
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(s.TmpDir(), e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// NewTmp returns a fresh, not yet existing path in the tmp dir.
func (s *Store) NewTmp(prefix string) string {
	b := make([]byte, 8)
	rand.Read(b)
	return filepath.Join(s.TmpDir(), prefix+hex.EncodeToString(b))
}

// LayerPath is where the layer with this diff ID is kept.
func (s *Store) LayerPath(diffID v1.Hash) string {
	return filepath.Join(s.Dir, diffID.Algorithm, diffID.Hex)
}

// BuildPath is where the build step layer with this cache key is kept.
func (s *Store) BuildPath(key string) string { return filepath.Join(s.Dir, "build", key) }

// Owns reports whether p is a layer of this store (and so may be removed
// by it).
func (s *Store) Owns(p string) bool {
	rel, err := filepath.Rel(s.Dir, p)
	if err != nil || strings.HasPrefix(rel, "..") {
		return false
	}
	parts := strings.Split(rel, string(filepath.Separator))
	return len(parts) == 2 && (parts[0] == "sha256" || parts[0] == "build") && parts[1] != "" && parts[1] != "." && parts[1] != ".."
}

// Remove deletes a layer of the store.
func (s *Store) Remove(p string) error {
	if !s.Owns(p) {
		return fmt.Errorf("%s is not a layer of %s", p, s.Dir)
	}
	return os.RemoveAll(p)
}

// Commit renames a finished layer dir tmp into place at final. When final
// exists already (a concurrent pull of the same layer), tmp is dropped.
func Commit(tmp, final string) error {
	if err := os.Rename(tmp, final); err != nil {
		if _, serr := os.Stat(final); serr == nil {
			os.RemoveAll(tmp)
			return nil
		}
		os.RemoveAll(tmp)
		return err
	}
	return nil
}

// Progress is reported while layers are pulled.
type Progress struct {
	Layer      int    // 1-based index of the layer being pulled
	Layers     int    // number of layers
	Digest     string // the layer's diff ID
	Bytes      int64  // uncompressed bytes unpacked of this layer so far
	Size       int64  // compressed size of the layer
	Cached     bool   // the layer was already in the store
	Done       bool   // the layer is in place
	TotalBytes int64  // uncompressed bytes unpacked so far in this pull
}

// Pull makes sure every layer of img is in the store and returns their
// paths topmost first (the order of runtime.Spec.Layers), leaving out
// layers without entries.
func (s *Store) Pull(ctx context.Context, img v1.Image, progress func(Progress)) ([]string, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("image layers: %w", err)
	}
	if progress == nil {
		progress = func(Progress) {}
	}
	var total int64
	var out []string
	for i, l := range layers {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		diffID, err := l.DiffID()
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", i+1, err)
		}
		size, _ := l.Size()
		p := Progress{Layer: i + 1, Layers: len(layers), Digest: diffID.String(), Size: size}
		final := s.LayerPath(diffID)
		if _, err := os.Stat(final); err == nil {
			p.Cached, p.Done, p.TotalBytes = true, true, total
			progress(p)
		} else {
			progress(p)
			n, err := s.unpackLayer(ctx, l, final, func(n int64) {
				q := p
				q.Bytes, q.TotalBytes = n, total+n
				progress(q)
			})
			total += n
			if err != nil {
				return nil, fmt.Errorf("layer %d/%d (%s): %w", i+1, len(layers), diffID, err)
			}
			p.Bytes, p.Done, p.TotalBytes = n, true, total
			progress(p)
		}
		if empty, _ := isEmptyDir(final); !empty || isOpaque(final) {
			out = append(out, final)
		}
	}
	// Image layers are bottom first; overlay lowerdir wants topmost first.
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}

func (s *Store) unpackLayer(ctx context.Context, l v1.Layer, final string, onBytes func(int64)) (int64, error) {
	rc, err := l.Uncompressed()
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	cr := &countingReader{r: rc, ctx: ctx, on: onBytes}
	tmp := s.NewTmp("layer-")
	if err := Unpack(cr, tmp); err != nil {
		return cr.n.Load(), err
	}
	// Drain so the digest of the whole stream is verified.
	if _, err := io.Copy(io.Discard, cr); err != nil {
		os.RemoveAll(tmp)
		return cr.n.Load(), err
	}
	if err := rc.Close(); err != nil {
		os.RemoveAll(tmp)
		return cr.n.Load(), fmt.Errorf("verify layer: %w", err)
	}
	return cr.n.Load(), Commit(tmp, final)
}

type countingReader struct {
	r    io.Reader
	ctx  context.Context
	n    atomic.Int64
	on   func(int64)
	last int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := c.r.Read(p)
	total := c.n.Add(int64(n))
	if total-c.last >= 1<<20 || (errors.Is(err, io.EOF) && total != c.last) {
		c.last = total
		c.on(total)
	}
	return n, err
}

func isEmptyDir(p string) (bool, error) {
	f, err := os.Open(p)
	if err != nil {
		return false, err
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return len(names) == 0, nil
	}
	return false, err
}

func isOpaque(p string) bool {
	buf := make([]byte, 4)
	n, err := unix.Lgetxattr(p, OpaqueXattr, buf)
	return err == nil && n == 1 && buf[0] == 'y'
}
