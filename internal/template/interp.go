package template

import (
	"context"
	"io"
	"path/filepath"
	"time"

	"github.com/nookhq/nook/internal/agentwire"
	"github.com/nookhq/nook/internal/rootfs"
)

// CodeInterpreterID is the template the code-interpreter SDK asks for by
// default: Debian bookworm with Jupyter's ipykernel, numpy, pandas and
// matplotlib, and Node for JavaScript cells.
const CodeInterpreterID = "code-interpreter-v1"

// CodeInterpreterPackages are the Debian packages of CodeInterpreterID on
// top of the base packages.
var CodeInterpreterPackages = []string{
	"python3-ipykernel", "python3-matplotlib-inline", "python3-numpy", "python3-pandas",
	"python3-matplotlib",
}

// EnsureCodeInterpreter builds the code-interpreter-v1 template (mmdebstrap,
// like base) if its root filesystem does not exist yet, and (re)writes its
// record: sandboxes from it run nook-interp on port 49999, and create waits
// until the default Python kernel is up (the probe), so the first runCode
// does not wait for a kernel boot.
func (r *Registry) EnsureCodeInterpreter(ctx context.Context, mirror string, progress io.Writer) error {
	id := CodeInterpreterID
	root := filepath.Join(r.dir, id, "rootfs")
	created := time.Now().UTC()
	if t, err := r.Get(id); err == nil && t.State == StateReady {
		created = t.CreatedAt
	}
	pkgs := append(append([]string{}, rootfs.BasePackages...), CodeInterpreterPackages...)
	opts := rootfs.DebianOptions{Suite: "bookworm", Mirror: mirror, Packages: pkgs, User: "user"}
	if _, err := r.debianRootfs(ctx, id, opts, progress); err != nil {
		return err
	}
	return r.Put(Template{
		ID: id, Aliases: []string{"code-interpreter"}, State: StateReady, Layers: []string{root},
		Env: []string{DefaultPath}, CPUMillis: DefaultCPUMillis, MemoryMB: DefaultMemoryMB,
		DiskMB: DefaultDiskMB, PidsMax: DefaultPidsMax, CreatedAt: created,
		CodeInterpreter: true,
		ProbePort:       agentwire.CodeInterpreterPort, ProbePath: "/health", ProbeTimeout: 60 * time.Second,
	})
}
