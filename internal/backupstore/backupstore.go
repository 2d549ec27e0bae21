// Package backupstore keeps backup archives: in a local directory (nook's
// own store) and, when configured, in an S3-compatible bucket.
//
// A store only moves bytes. Checking them against the digest recorded for
// a backup is the caller's job, on every read, whichever store they came
// from.
package backupstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// ErrNotFound is returned by Get when the store holds no object of that key.
var ErrNotFound = errors.New("not in the backup store")

// Store keeps objects by key.
type Store interface {
	// Put stores r's bytes under key, replacing any object of that key.
	// size is the number of bytes (-1: unknown); digest, the sha256 (hex)
	// of the bytes, is kept with the object where the store has metadata.
	// The object is complete once Put returns nil, and absent or the old
	// one otherwise.
	Put(ctx context.Context, key string, r io.Reader, size int64, digest string) error
	// Get opens the object of key; ErrNotFound when there is none.
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	// Delete removes the object of key; no error when there is none.
	Delete(ctx context.Context, key string) error
	// String describes where the store is, without any secret.
	String() string
}

// validKey refuses keys that could leave a directory or be ambiguous.
func validKey(key string) error {
	if key == "" || len(key) > 512 || strings.ContainsAny(key, "/\\\x00") || key == "." || key == ".." {
		return fmt.Errorf("backup store: invalid key %q", key)
	}
	return nil
}

// Dir is a store in a local directory: the object of key is the file
// Dir/key+Suffix. Put writes a temporary file (key+Suffix+".tmp"), flushes
// it and renames it into place, so a crash never leaves a half-written
// object under its final name.
type Dir struct {
	Path   string
	Suffix string
}

// File is the path of key's object.
func (d Dir) File(key string) string { return filepath.Join(d.Path, key+d.Suffix) }

// Temp is the path Put writes key's object to before renaming it.
func (d Dir) Temp(key string) string { return d.File(key) + ".tmp" }

func (d Dir) String() string { return d.Path }

func (d Dir) Put(ctx context.Context, key string, r io.Reader, size int64, _ string) error {
	if err := validKey(key); err != nil {
		return err
	}
	if err := os.MkdirAll(d.Path, 0o700); err != nil {
		return err
	}
	tmp := d.Temp(key)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = func() error {
		defer f.Close()
		n, err := io.Copy(f, ctxReader{ctx, r})
		if err != nil {
			return err
		}
		if size >= 0 && n != size {
			return fmt.Errorf("backup store: wrote %d bytes of %d", n, size)
		}
		if err := f.Sync(); err != nil {
			return err
		}
		return f.Close()
	}()
	if err == nil {
		err = os.Rename(tmp, d.File(key))
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(d.Path)
}

func (d Dir) Get(_ context.Context, key string) (io.ReadCloser, error) {
	if err := validKey(key); err != nil {
		return nil, err
	}
	f, err := os.Open(d.File(key))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", d.File(key), ErrNotFound)
	}
	return f, err
}

func (d Dir) Delete(_ context.Context, key string) error {
	if err := validKey(key); err != nil {
		return err
	}
	if err := os.Remove(d.File(key)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// ctxReader stops a copy when ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
