// Package runtime defines the contract between the sandbox manager and the
// thing that actually isolates a sandbox (an OCI runtime on this host, later
// a gVisor or Kubernetes driver). Drivers live in subpackages.
//
// Contract every driver keeps:
//   - Start either returns nil with the sandbox running, or an error with
//     nothing of the sandbox left behind (no mount, cgroup, process, dir).
//   - Stop is idempotent: stopping an unknown or half-made sandbox cleans
//     whatever is left of it and returns nil.
//   - List reports every sandbox the driver still holds any resource for,
//     so that a restarted server can re-adopt or clean them.
package runtime

import (
	"context"
	"errors"
	"io"
	"os"
)

// ErrNotFound is returned when the driver holds nothing for an id.
var ErrNotFound = errors.New("sandbox not found in runtime")

// Mount is a bind mount from the host into the sandbox.
type Mount struct {
	Source   string // host path
	Target   string // path inside the sandbox
	ReadOnly bool
}

// Limits are the resources a sandbox may use.
type Limits struct {
	CPUMillis     int64 // CPU time in millicores (1000 = one core); 0 = unlimited
	MemoryBytes   int64 // memory incl. the writable layer (tmpfs); 0 = unlimited
	PidsMax       int64 // maximum number of tasks; 0 = unlimited
	WritableBytes int64 // size of the writable root layer; required
}

// Spec describes one sandbox to start.
type Spec struct {
	ID       string
	Hostname string
	// Layers are read-only root filesystem directories, topmost first. Their
	// files are owned by the user-namespace-shifted ids (see HostUIDBase).
	Layers []string
	Limits Limits
	// Args and Env are PID 1's argv and environment (the image environment).
	Args []string
	Env  []string
	Cwd  string
	// Mounts are extra bind mounts (the agent binary, the run dir).
	Mounts []Mount
	// LogPath receives PID 1's stdout and stderr.
	LogPath string
	// NetNSPath joins an existing network namespace; empty makes a new,
	// loopback-only one.
	NetNSPath string
	// UserNSPath joins an existing user namespace (with the mapping of
	// HostUIDBase/IDMapSize) that owns NetNSPath; empty makes a new one.
	UserNSPath string
	// UpperFrom, when set, is a directory whose contents become the new
	// writable layer before PID 1 starts (resume, clone, rollback).
	UpperFrom string
	// Runtime names the driver a Router starts the sandbox with ("" is
	// the default driver, "gvisor" gVisor's runsc).
	Runtime string
	// ExtraFiles are passed to PID 1 as file descriptors 3, 4, ... by
	// drivers that can (runc); others leave them out, and PID 1 must cope.
	// The caller keeps ownership.
	ExtraFiles []*os.File
}

// Info is what a driver knows of a running sandbox.
type Info struct {
	ID      string
	Running bool
	Pid     int // PID 1 of the sandbox in the host's pid namespace
}

// Runtime starts and stops isolated sandboxes.
type Runtime interface {
	Start(ctx context.Context, spec Spec) error
	Stop(ctx context.Context, id string) error
	Inspect(ctx context.Context, id string) (Info, error)
	List(ctx context.Context) ([]string, error)
}

// ExecSpec is a process to start inside a running sandbox's namespaces (the
// OCI exec path, as `docker exec`): it bypasses the in-sandbox agent, so it
// works even when the agent is wedged. It starts from PID 1's process
// settings: its environment is the image environment (plus Env).
type ExecSpec struct {
	Args []string
	Env  []string // added to the image environment (e.g. TERM for a terminal)
	Cwd  string   // empty: "/"
	User string   // name, uid or uid:gid inside the sandbox; empty: root
	TTY  bool
	Cols uint16
	Rows uint16
}

// ExecProcess is a started exec. With TTY, Stdout is the terminal and
// Stderr is nil.
type ExecProcess interface {
	Stdin() io.WriteCloser // nil unless asked for
	Stdout() io.Reader
	Stderr() io.Reader
	Resize(cols, rows uint16) error
	// Wait returns the process's exit code once it ended.
	Wait() (int, error)
	// Kill ends the process (hang-up, then kill).
	Kill() error
}

// Execer is implemented by runtimes that can start a process in a running
// sandbox. withStdin gives the process a stdin the caller writes.
type Execer interface {
	Exec(ctx context.Context, id string, spec ExecSpec, withStdin bool) (ExecProcess, error)
}

// HostUIDBase is the first host uid (and gid) that the sandboxes' user
// namespaces map their ids onto: uid 0 inside is HostUIDBase outside.
const HostUIDBase = 100000

// IDMapSize is how many ids each sandbox's user namespace maps.
const IDMapSize = 65536
