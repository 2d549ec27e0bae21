// Package template keeps the templates sandboxes start from: their root
// filesystem layers, image configuration and resource defaults.
package template

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/rootfs"
	"github.com/nookhq/nook/internal/store"
)

const bucket = "templates"

// Build states.
const (
	StatePulling  = "PULLING"
	StateBuilding = "BUILDING"
	StateReady    = "READY"
	StateFailed   = "FAILED"
)

// BaseID is the default template that stands alone: Debian bookworm.
const BaseID = "base"

// Template is one template record.
type Template struct {
	ID      string   `json:"id"`
	Aliases []string `json:"aliases,omitempty"`
	State   string   `json:"state"`
	Reason  string   `json:"reason,omitempty"`
	// Layers are read-only root filesystem dirs, topmost first.
	Layers []string `json:"layers"`
	// Env is the image environment (OCI Env plus template --env).
	Env        []string `json:"env"`
	Cmd        []string `json:"cmd,omitempty"`
	WorkingDir string   `json:"workingDir,omitempty"`
	User       string   `json:"user,omitempty"`
	CPUMillis  int64    `json:"cpuMillis"`
	MemoryMB   int64    `json:"memoryMB"`
	DiskMB     int64    `json:"diskMB"`
	PidsMax    int64    `json:"pidsMax"`
	// EnvdInheritImageEnv lets envd commands see the image env (off by
	// default, as the CubeSandbox table says).
	EnvdInheritImageEnv bool `json:"envdInheritImageEnv,omitempty"`
	// CodeInterpreter runs nook-interp (run_code on port 49999) in every
	// sandbox; RunCodeInheritSandboxEnv lets run_code see the sandbox env.
	CodeInterpreter          bool `json:"codeInterpreter,omitempty"`
	RunCodeInheritSandboxEnv bool `json:"runCodeInheritSandboxEnv,omitempty"`
	// NetworkDefaults is the default egress policy of the template's
	// sandboxes (allowInternetAccess, allowOut, denyOut; see network.go).
	NetworkDefaults
	// ProbePort, when set, is a sandbox port that must answer an HTTP GET
	// of ProbePath with a 2xx before the template is READY and before any
	// sandbox create from it answers.
	ProbePort    int           `json:"probePort,omitempty"`
	ProbePath    string        `json:"probePath,omitempty"`
	ProbeTimeout time.Duration `json:"probeTimeout,omitempty"`
	// PoolSize is how many started sandboxes nook keeps warm for this
	// template; nil uses nook serve's --pool-size, 0 disables.
	PoolSize *int `json:"poolSize,omitempty"`
	// ExposedPorts are the ports the image declares (informational).
	ExposedPorts []int     `json:"exposedPorts,omitempty"`
	CreatedAt    time.Time `json:"createdAt"`
	// Source is what the template was made from (an image reference or
	// "dockerfile"); BuildID its latest build (see build.go).
	Source    string    `json:"source,omitempty"`
	BuildID   string    `json:"buildID,omitempty"`
	UpdatedAt time.Time `json:"updatedAt,omitempty"`
	// DNS are the resolvers sandboxes of this template should use.
	DNS []string `json:"dns,omitempty"`
	// Internal marks a record a build uses for its probe sandbox; it is
	// not listed.
	Internal bool `json:"internal,omitempty"`
	// Runtime runs this template's sandboxes with another driver: "gvisor"
	// (runsc; pauses keep memory). Empty is runc.
	Runtime string `json:"runtime,omitempty"`
}

// Resource defaults, as CubeSandbox's: 2000 millicores, 2000 MB.
const (
	DefaultCPUMillis = 2000
	DefaultMemoryMB  = 2000
	DefaultDiskMB    = 1024
	DefaultPidsMax   = 1024
)

// DefaultPath is the PATH of templates whose image sets none.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

var idPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// ValidID reports whether s may name a template: lowercase letters, digits,
// '-' and '_', so that no id can reach outside the data dir.
func ValidID(s string) bool { return idPattern.MatchString(s) }

// Registry stores templates and their root filesystems under dataDir.
type Registry struct {
	st  *store.Store
	dir string
	// RootfsCache, when set, is a directory shared between data dirs where
	// built-in template root filesystems are kept (see debianRootfs).
	RootfsCache string
}

// NewRegistry returns a registry keeping root filesystems in dataDir/templates.
func NewRegistry(st *store.Store, dataDir string) (*Registry, error) {
	dir := filepath.Join(dataDir, "templates")
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, err
	}
	return &Registry{st: st, dir: dir}, nil
}

// Get resolves a template by id or alias.
func (r *Registry) Get(idOrAlias string) (Template, error) {
	if !ValidID(idOrAlias) {
		return Template{}, fmt.Errorf("template %q: %w", idOrAlias, errdefs.ErrInvalid)
	}
	var t Template
	err := r.st.Get(bucket, idOrAlias, &t)
	if errors.Is(err, store.ErrNotFound) {
		all, lerr := r.List()
		if lerr != nil {
			return Template{}, lerr
		}
		for _, c := range all {
			for _, a := range c.Aliases {
				if a == idOrAlias {
					return c, nil
				}
			}
		}
		return Template{}, fmt.Errorf("template %q: %w", idOrAlias, errdefs.ErrNotFound)
	}
	return t, err
}

// List returns every template.
func (r *Registry) List() ([]Template, error) { return store.All[Template](r.st, bucket) }

// Put stores a template record. Its id and aliases must be valid ids.
func (r *Registry) Put(t Template) error {
	for _, id := range append([]string{t.ID}, t.Aliases...) {
		if !ValidID(id) {
			return fmt.Errorf("template id or alias %q: want 1-63 of a-z, 0-9, '-', '_': %w", id, errdefs.ErrInvalid)
		}
	}
	if err := r.st.Put(bucket, t.ID, t); err != nil {
		return err
	}
	return r.st.Sync() // templates outlive a host crash: keep their records too
}

// Delete removes a template record (not its layers; see Builder.Delete).
func (r *Registry) Delete(id string) error { return r.st.Delete(bucket, id) }

// DataDir is the data dir the registry keeps its files under.
func (r *Registry) DataDir() string { return filepath.Dir(r.dir) }

// Store is the store the registry keeps its records in.
func (r *Registry) Store() *store.Store { return r.st }

// EnsureBase builds the `base` template (Debian bookworm via mmdebstrap) if
// it is not ready yet, writing progress to progress.
func (r *Registry) EnsureBase(ctx context.Context, mirror string, progress io.Writer) error {
	if t, err := r.Get(BaseID); err == nil && t.State == StateReady {
		return nil
	}
	opts := rootfs.DebianOptions{Suite: "bookworm", Mirror: mirror, Packages: rootfs.BasePackages, User: "user"}
	root, err := r.debianRootfs(ctx, BaseID, opts, progress)
	if err != nil {
		return err
	}
	return r.Put(Template{
		ID: BaseID, State: StateReady, Layers: []string{root},
		Env: []string{DefaultPath}, CPUMillis: DefaultCPUMillis, MemoryMB: DefaultMemoryMB,
		DiskMB: DefaultDiskMB, PidsMax: DefaultPidsMax, CreatedAt: time.Now().UTC(),
	})
}
