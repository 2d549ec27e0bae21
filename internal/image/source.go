// Package image pulls OCI images (registries, OCI layouts, OCI and docker
// archives) through go-containerregistry and keeps their layers unpacked,
// once per digest, as overlayfs lower layers for templates.
package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/nookhq/nook/internal/errdefs"
)

// Source prefixes besides plain registry references.
const (
	PrefixOCILayout     = "oci-layout:"
	PrefixOCIArchive    = "oci-archive:"
	PrefixDockerArchive = "docker-archive:"
	PrefixDocker        = "docker://"
)

// Platform is the one platform nook runs.
var Platform = v1.Platform{OS: "linux", Architecture: "amd64"}

// Auth is registry credentials from the user; empty means the user's docker
// config (~/.docker/config.json) or anonymous.
type Auth struct {
	Username string
	Password string
}

// Source is an opened image.
type Source struct {
	Ref     string // as the user gave it
	Image   v1.Image
	cleanup func()
}

// Close releases temporary files of the source (an unpacked oci-archive).
func (s *Source) Close() {
	if s.cleanup != nil {
		s.cleanup()
	}
}

// IsLocal reports whether ref names a local file or directory source.
func IsLocal(ref string) bool {
	return strings.HasPrefix(ref, PrefixOCILayout) || strings.HasPrefix(ref, PrefixOCIArchive) || strings.HasPrefix(ref, PrefixDockerArchive)
}

// Open resolves ref to one linux/amd64 image. tmpDir holds temporary files
// (an oci-archive is unpacked there until Close).
func Open(ctx context.Context, ref string, auth Auth, tmpDir string) (*Source, error) {
	src, err := open(ctx, ref, auth, tmpDir)
	if err != nil {
		return nil, err
	}
	cf, err := src.Image.ConfigFile()
	if err != nil {
		src.Close()
		return nil, registryError(ref, fmt.Errorf("image config: %w", err))
	}
	if (cf.OS != "" && cf.OS != Platform.OS) || (cf.Architecture != "" && cf.Architecture != Platform.Architecture) {
		src.Close()
		return nil, fmt.Errorf("image %s is for %s/%s; nook runs %s/%s: %w", ref, cf.OS, cf.Architecture, Platform.OS, Platform.Architecture, errdefs.ErrInvalid)
	}
	return src, nil
}

func open(ctx context.Context, ref string, auth Auth, tmpDir string) (*Source, error) {
	ref = strings.TrimSpace(ref)
	if ref == "" {
		return nil, fmt.Errorf("image reference is empty: %w", errdefs.ErrInvalid)
	}
	switch {
	case strings.HasPrefix(ref, PrefixOCILayout):
		dir, sel := splitSel(strings.TrimPrefix(ref, PrefixOCILayout))
		img, err := fromLayout(dir, sel)
		if err != nil {
			return nil, fmt.Errorf("oci-layout %s: %w", dir, err)
		}
		return &Source{Ref: ref, Image: img}, nil
	case strings.HasPrefix(ref, PrefixOCIArchive):
		file, sel := splitSel(strings.TrimPrefix(ref, PrefixOCIArchive))
		dir, err := os.MkdirTemp(tmpDir, "oci-archive-")
		if err != nil {
			return nil, err
		}
		if err := untarPlain(file, dir); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("oci-archive %s: %w", file, err)
		}
		img, err := fromLayout(dir, sel)
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("oci-archive %s: %w", file, err)
		}
		return &Source{Ref: ref, Image: img, cleanup: func() { os.RemoveAll(dir) }}, nil
	case strings.HasPrefix(ref, PrefixDockerArchive):
		file, sel := splitSel(strings.TrimPrefix(ref, PrefixDockerArchive))
		if _, err := os.Stat(file); err != nil {
			return nil, fmt.Errorf("docker-archive: %w: %w", err, errdefs.ErrInvalid)
		}
		var tag *name.Tag
		if sel != "" {
			t, err := name.NewTag(sel)
			if err != nil {
				return nil, fmt.Errorf("docker-archive tag %q: %v: %w", sel, err, errdefs.ErrInvalid)
			}
			tag = &t
		}
		img, err := tarball.ImageFromPath(file, tag)
		if err != nil {
			return nil, fmt.Errorf("docker-archive %s: %v: %w", file, err, errdefs.ErrInvalid)
		}
		return &Source{Ref: ref, Image: img}, nil
	}
	r, err := name.ParseReference(strings.TrimPrefix(ref, PrefixDocker))
	if err != nil {
		return nil, fmt.Errorf("image reference %q: %v: %w", ref, err, errdefs.ErrInvalid)
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithPlatform(Platform)}
	if auth.Username != "" || auth.Password != "" {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: auth.Username, Password: auth.Password}))
	} else {
		opts = append(opts, remote.WithAuthFromKeychain(authn.DefaultKeychain))
	}
	img, err := remote.Image(r, opts...)
	if err != nil {
		return nil, registryError(ref, err)
	}
	return &Source{Ref: ref, Image: img}, nil
}

// registryError makes a registry failure readable.
func registryError(ref string, err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		switch te.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			return fmt.Errorf("pull %s: the registry refused the credentials (HTTP %d); check --registry-username/--registry-password or ~/.docker/config.json: %w",
				ref, te.StatusCode, errdefs.ErrInvalid)
		case http.StatusNotFound:
			return fmt.Errorf("pull %s: no such image in the registry: %w", ref, errdefs.ErrNotFound)
		}
	}
	return fmt.Errorf("pull %s: %w", ref, err)
}

// splitSel splits "PATH[@SELECTOR]" where SELECTOR is a tag/ref name or a
// digest. A path that exists as given wins.
func splitSel(s string) (string, string) {
	if _, err := os.Stat(s); err == nil {
		return s, ""
	}
	if i := strings.LastIndex(s, "@"); i > 0 {
		return s[:i], s[i+1:]
	}
	if i := strings.LastIndex(s, ":"); i > 0 {
		return s[:i], s[i+1:]
	}
	return s, ""
}

// fromLayout picks one image out of an OCI layout: the one whose digest or
// ref-name annotation is sel, else the linux/amd64 one (or the only one).
func fromLayout(dir, sel string) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("%v: %w", err, errdefs.ErrInvalid)
	}
	return fromIndex(idx, sel)
}

func fromIndex(idx v1.ImageIndex, sel string) (v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var candidates []v1.Descriptor
	for _, d := range im.Manifests {
		if sel != "" && d.Digest.String() != sel && d.Annotations["org.opencontainers.image.ref.name"] != sel {
			continue
		}
		candidates = append(candidates, d)
	}
	if len(candidates) == 0 {
		return nil, fmt.Errorf("no image %q in the index: %w", sel, errdefs.ErrNotFound)
	}
	// Images for this platform (or without one) before others.
	sort.SliceStable(candidates, func(i, j int) bool { return platformOK(candidates[i]) && !platformOK(candidates[j]) })
	for _, d := range candidates {
		if !platformOK(d) {
			continue
		}
		if d.MediaType.IsIndex() {
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, err
			}
			if img, err := fromIndex(child, ""); err == nil {
				return img, nil
			}
			continue
		}
		if d.MediaType.IsImage() {
			return idx.Image(d.Digest)
		}
	}
	return nil, fmt.Errorf("no %s/%s image in the index: %w", Platform.OS, Platform.Architecture, errdefs.ErrNotFound)
}

func platformOK(d v1.Descriptor) bool {
	return d.Platform == nil || d.Platform.OS == "" || (d.Platform.OS == Platform.OS && d.Platform.Architecture == Platform.Architecture)
}

// untarPlain extracts an oci-archive (a tar of an OCI layout: regular files
// and directories only) into dir.
func untarPlain(file, dir string) error {
	f, err := os.Open(file)
	if err != nil {
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalid)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%v: %w", err, errdefs.ErrInvalid)
		}
		rel, err := clean(hdr.Name)
		if err != nil {
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
		p := filepath.Join(dir, rel)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o700); err != nil {
				return err
			}
		case tar.TypeReg, tar.TypeRegA:
			if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
				return err
			}
			out, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
	}
}

// Config is what a template takes from an image's configuration.
type Config struct {
	Env          []string
	Entrypoint   []string
	Cmd          []string
	WorkingDir   string
	User         string
	ExposedPorts []int
}

// ConfigOf reads the run configuration of img.
func ConfigOf(img v1.Image) (Config, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return Config{}, fmt.Errorf("image config: %w", err)
	}
	c := cf.Config
	out := Config{Env: c.Env, Entrypoint: c.Entrypoint, Cmd: c.Cmd, WorkingDir: c.WorkingDir, User: c.User}
	for p := range c.ExposedPorts {
		num, _, _ := strings.Cut(p, "/")
		if n, err := strconv.Atoi(num); err == nil && n > 0 && n < 65536 {
			out.ExposedPorts = append(out.ExposedPorts, n)
		}
	}
	sort.Ints(out.ExposedPorts)
	return out, nil
}
