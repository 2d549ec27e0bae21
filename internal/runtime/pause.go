package runtime

import "context"

// Pauser is implemented by drivers that can stop a sandbox while keeping its
// state on disk, and start it again from there.
type Pauser interface {
	// Pause stops sandbox id and saves its writable layer into dir/upper
	// (dir exists and is empty) and, when keepMemory is set and the driver
	// can, its memory into dir as well; it reports whether memory was
	// saved. On success nothing of the sandbox is left running or mounted.
	Pause(ctx context.Context, id, dir string, keepMemory bool) (memory bool, err error)
	// Restore starts a sandbox whose memory Pause saved in dir; spec is the
	// sandbox's spec as at its start, with UpperFrom = dir/upper.
	Restore(ctx context.Context, spec Spec, dir string) error
	// CopyLayer copies a running sandbox's writable layer to dst (which
	// must not exist yet), freezing its processes while it copies.
	CopyLayer(ctx context.Context, id, dst string) error
	// RootPath is the host path of the running sandbox's merged root
	// filesystem, for reading and writing files while it is frozen.
	RootPath(id string) string
	// Freeze stops (thaw=false) or continues (thaw=true) every process of
	// the sandbox without ending them.
	Freeze(ctx context.Context, id string, thaw bool) error
}

// PauseUpper is the name of the writable layer's copy inside a pause dir.
const PauseUpper = "upper"
