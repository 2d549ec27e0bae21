package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nookhq/nook/internal/agentclient"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/runtime"
	"github.com/nookhq/nook/internal/template"
	"golang.org/x/sys/unix"
)

// StatePaused is the state of a sandbox whose processes are stopped and
// whose writable layer (and memory, in memory mode) is saved on disk.
const StatePaused = "paused"

// Pause modes, as a sandbox's info tells them.
const (
	PauseMemory     = "memory"     // processes and memory continue after resume
	PauseFilesystem = "filesystem" // files kept; resume restarts the start command
)

// ErrPaused is returned for a sandbox that is paused where a running one is
// needed (it is a conflict: 409).
var ErrPaused = fmt.Errorf("sandbox is paused: %w", errdefs.ErrConflict)

// Lifecycle is what happens at a sandbox's end time and on traffic while it
// is paused (E2B autoPause / lifecycle.onTimeout, autoPauseMemory,
// autoResume).
type Lifecycle struct {
	// AutoPause pauses instead of killing at the end time.
	AutoPause bool `json:"autoPause,omitempty"`
	// AutoPauseMemory is the keepMemory of that pause (nil: true).
	AutoPauseMemory *bool `json:"autoPauseMemory,omitempty"`
	// AutoResume resumes a paused sandbox on traffic through the proxy.
	AutoResume bool `json:"autoResume,omitempty"`
}

// PauseInfo is the pause state and settings of a sandbox record.
type PauseInfo struct {
	Lifecycle
	// PauseMode is how the sandbox was last paused: PauseMemory or
	// PauseFilesystem; PauseNote says why memory was not kept when it was
	// asked for.
	PauseMode string     `json:"pauseMode,omitempty"`
	PauseNote string     `json:"pauseNote,omitempty"`
	PausedAt  *time.Time `json:"pausedAt,omitempty"`
	// Layers, when set, replace the template's read-only layers (a
	// sandbox rolled back to a snapshot).
	Layers []string `json:"layers,omitempty"`
	// Runtime is the driver the sandbox runs with ("" runc, "gvisor").
	Runtime string `json:"runtime,omitempty"`
	// Network is the network the sandbox was created with, set up again
	// on resume.
	Network *NetworkConfig `json:"network,omitempty"`
}

func newPauseInfo(tpl template.Template, o CreateOptions) PauseInfo {
	p := PauseInfo{Lifecycle: o.Lifecycle, Runtime: tpl.Runtime}
	if o.from != nil && len(o.from.layers) > 0 {
		p.Layers = o.from.layers
	}
	if !isZeroNetwork(o.Network) {
		n := o.Network
		p.Network = &n
	}
	return p
}

func isZeroNetwork(n NetworkConfig) bool {
	b, _ := json.Marshal(n)
	return string(b) == "{}"
}

// opLocks serialises the pause, resume, snapshot and kill of one sandbox.
type opLocks struct {
	mu sync.Mutex
	m  map[string]*opLock
}

type opLock struct {
	mu   sync.Mutex
	refs int
}

// lock takes id's lock and returns its unlock.
func (o *opLocks) lock(id string) func() {
	o.mu.Lock()
	if o.m == nil {
		o.m = map[string]*opLock{}
	}
	l := o.m[id]
	if l == nil {
		l = &opLock{}
		o.m[id] = l
	}
	l.refs++
	o.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		o.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(o.m, id)
		}
		o.mu.Unlock()
	}
}

// startFrom is where a sandbox's start takes its state from.
type startFrom struct {
	upper  string   // copied in as the writable layer
	memDir string   // restore memory from here (gVisor)
	resume bool     // the sandbox exists (same id, record, run dir)
	layers []string // read-only layers replacing the template's
}

func (f *startFrom) resuming() bool   { return f != nil && f.resume }
func (f *startFrom) withMemory() bool { return f != nil && f.memDir != "" }

// startSpec starts the runtime for spec, from saved state when from says.
func (m *Manager) startSpec(ctx context.Context, spec runtime.Spec, from *startFrom) error {
	if from == nil {
		return m.cfg.Runtime.Start(ctx, spec)
	}
	spec.UpperFrom = from.upper
	if len(from.layers) > 0 {
		spec.Layers = from.layers
	}
	if from.memDir != "" {
		p, ok := m.cfg.Runtime.(runtime.Pauser)
		if !ok {
			return fmt.Errorf("runtime cannot restore memory: %w", errdefs.ErrConflict)
		}
		return p.Restore(ctx, spec, from.memDir)
	}
	return m.cfg.Runtime.Start(ctx, spec)
}

// releaseRunning stops the runtime and network of id but keeps its record,
// run dir and paused state (a failed resume).
func (m *Manager) releaseRunning(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := m.cfg.Runtime.Stop(ctx, id); err != nil {
		m.cfg.Log.Error("stop sandbox after a failed resume", "id", id, "err", err)
	}
	if m.cfg.Network != nil {
		if err := m.cfg.Network.Teardown(ctx, id); err != nil {
			m.cfg.Log.Error("network teardown after a failed resume", "id", id, "err", err)
		}
	}
}

func (m *Manager) pausedRoot() string        { return filepath.Join(m.cfg.DataDir, "paused") }
func (m *Manager) pauseDir(id string) string { return filepath.Join(m.pausedRoot(), id) }

// pauseMeta is written into a pause dir before it is renamed into place:
// a pause dir without it is never used.
type pauseMeta struct {
	ID       string    `json:"id"`
	Mode     string    `json:"mode"`
	Note     string    `json:"note,omitempty"`
	PausedAt time.Time `json:"pausedAt"`
}

const pauseMetaFile = "pause.json"

func readPauseMeta(dir string) (pauseMeta, error) {
	var pm pauseMeta
	data, err := os.ReadFile(filepath.Join(dir, pauseMetaFile))
	if err != nil {
		return pm, err
	}
	if err := json.Unmarshal(data, &pm); err != nil {
		return pm, fmt.Errorf("%s: %w", filepath.Join(dir, pauseMetaFile), err)
	}
	if _, err := os.Stat(filepath.Join(dir, runtime.PauseUpper)); err != nil {
		return pm, err
	}
	return pm, nil
}

func (m *Manager) removePaused(id string) error {
	if err := os.RemoveAll(m.pauseDir(id) + ".tmp"); err != nil {
		return err
	}
	return os.RemoveAll(m.pauseDir(id))
}

// syncTree flushes the file system dir is on and dir's parent entry, so
// that a rename after it is durable with everything below it.
func syncTree(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncfs %s: %w", dir, err)
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

// Pause stops a running sandbox's processes and keeps its filesystem (and,
// when keepMemory is set and its runtime can, its memory) on disk. It frees
// the sandbox's memory: the processes end, its cgroup goes and its tmpfs
// writable layer is unmounted. A sandbox that is already paused is a
// conflict.
func (m *Manager) Pause(ctx context.Context, id string, keepMemory bool) (Sandbox, error) {
	if !ValidID(id) {
		return Sandbox{}, fmt.Errorf("sandbox id %q: %w", id, errdefs.ErrInvalid)
	}
	defer m.ops.lock(id)()
	ctx = context.WithoutCancel(ctx)
	l, err := m.lookup(id)
	if err != nil {
		return Sandbox{}, err
	}
	m.mu.Lock()
	rec := l.rec
	m.mu.Unlock()
	if rec.State == StatePaused {
		return rec, fmt.Errorf("sandbox %q is already paused: %w", id, errdefs.ErrConflict)
	}
	p, ok := m.cfg.Runtime.(runtime.Pauser)
	if !ok {
		return rec, fmt.Errorf("this runtime cannot pause sandboxes: %w", errdefs.ErrConflict)
	}
	start := time.Now()
	tmp := m.pauseDir(id) + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return rec, err
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return rec, err
	}
	l.agent.HTTP.CloseIdleConnections()
	memory, perr := p.Pause(ctx, id, tmp, keepMemory)
	if perr != nil {
		os.RemoveAll(tmp)
		if info, err := m.cfg.Runtime.Inspect(ctx, id); err == nil && info.Running {
			return rec, fmt.Errorf("pause sandbox %s: %w", id, perr)
		}
		// The sandbox is gone and nothing of it was saved.
		m.mu.Lock()
		delete(m.live, id)
		l.timer.Stop()
		m.mu.Unlock()
		m.cleanup(ctx, id)
		return rec, fmt.Errorf("pause sandbox %s failed and it could not be kept: %w", id, perr)
	}
	now := time.Now().UTC()
	pm := pauseMeta{ID: id, Mode: PauseFilesystem, PausedAt: now}
	if memory {
		pm.Mode = PauseMemory
	} else if keepMemory {
		pm.Note = noMemoryNote(rec.Runtime)
	}
	if err := m.commitPause(tmp, pm); err != nil {
		// The processes are gone but the layer copy is in tmp: keep the
		// record running-less is worse than trying the final dir again.
		return rec, fmt.Errorf("save paused sandbox %s: %w", id, err)
	}
	if m.cfg.Network != nil {
		if err := m.cfg.Network.Teardown(ctx, id); err != nil {
			m.cfg.Log.Warn("network teardown of a paused sandbox", "id", id, "err", err)
		}
	}
	rec.State = StatePaused
	rec.PauseMode, rec.PauseNote, rec.PausedAt = pm.Mode, pm.Note, &now
	m.mu.Lock()
	l.rec = rec
	l.timer.Stop()
	err = m.cfg.Store.Put(bucket, id, rec)
	m.mu.Unlock()
	if err != nil {
		return rec, err
	}
	m.cfg.Log.Info("sandbox paused", "id", id, "mode", pm.Mode, "took", time.Since(start).Round(time.Millisecond))
	return rec, nil
}

// commitPause writes the meta file into tmp, flushes it and renames it to
// the sandbox's pause dir.
func (m *Manager) commitPause(tmp string, pm pauseMeta) error {
	data, _ := json.Marshal(pm)
	if err := os.WriteFile(filepath.Join(tmp, pauseMetaFile), data, 0o600); err != nil {
		return err
	}
	if err := syncTree(tmp); err != nil {
		return err
	}
	final := m.pauseDir(pm.ID)
	if err := os.RemoveAll(final); err != nil {
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	return syncDir(m.pausedRoot())
}

func noMemoryNote(rt string) string {
	if rt == "gvisor" {
		return "memory could not be saved; paused the filesystem only (resume restarts the start command)"
	}
	return "runc sandboxes cannot keep memory on this host (CRIU 3.17 fails on this kernel); paused the filesystem only, resume restarts the start command. Templates with runtime gvisor pause with memory"
}

// Resume starts a paused sandbox again with the same id, hostname, access
// token, env and start command, from its saved writable layer (and memory
// in memory mode, unless memory is false), with end time now + timeout
// (DefaultTimeout when 0). It reports false, and changes nothing, when the
// sandbox is running already.
func (m *Manager) Resume(ctx context.Context, id string, timeout time.Duration, memory *bool) (Sandbox, bool, error) {
	if timeout < 0 || timeout > MaxTimeout {
		return Sandbox{}, false, fmt.Errorf("timeout must be between 1 s and %s: %w", MaxTimeout, errdefs.ErrInvalid)
	}
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	if !ValidID(id) {
		return Sandbox{}, false, fmt.Errorf("sandbox id %q: %w", id, errdefs.ErrInvalid)
	}
	defer m.ops.lock(id)()
	ctx = context.WithoutCancel(ctx)
	l, err := m.lookup(id)
	if err != nil {
		return Sandbox{}, false, err
	}
	m.mu.Lock()
	rec := l.rec
	m.mu.Unlock()
	if rec.State != StatePaused {
		return rec, false, nil
	}
	start := time.Now()
	tpl, err := m.templateFor(rec)
	if err != nil {
		return rec, false, fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	dir := m.pauseDir(id)
	if _, err := readPauseMeta(dir); err != nil {
		return rec, false, fmt.Errorf("resume sandbox %s: its paused state is unreadable: %v: %w", id, err, errdefs.ErrConflict)
	}
	from := &startFrom{resume: true, upper: filepath.Join(dir, runtime.PauseUpper)}
	if rec.PauseMode == PauseMemory && (memory == nil || *memory) {
		from.memDir = dir
	}
	netCfg := NetworkConfig{}
	if rec.Network != nil {
		netCfg = *rec.Network
	}
	b, err := m.bootFrom(ctx, id, tpl, netCfg, from)
	if err != nil {
		return rec, false, fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	if !from.withMemory() {
		ictx, cancel := context.WithTimeout(ctx, readyTimeout)
		err := b.agent.Init(ictx, agentInit(rec))
		cancel()
		if err != nil {
			m.releaseRunning(ctx, id)
			return rec, false, fmt.Errorf("resume sandbox %s: %w", id, err)
		}
	}
	rec.State = StateRunning
	rec.PausedAt = nil
	rec.EndAt = time.Now().UTC().Add(timeout)
	m.mu.Lock()
	l.rec = rec
	l.agent = b.agent
	err = m.cfg.Store.Put(bucket, id, rec)
	m.armLocked(l)
	m.mu.Unlock()
	if err != nil {
		return rec, true, err
	}
	if err := m.removePaused(id); err != nil {
		m.cfg.Log.Warn("remove paused state", "id", id, "err", err)
	}
	m.cfg.Log.Info("sandbox resumed", "id", id, "mode", rec.PauseMode, "memory", from.withMemory(), "took", time.Since(start).Round(time.Millisecond))
	return rec, true, nil
}

// AutoResume resumes a paused sandbox whose lifecycle allows resuming on
// traffic; it is what the proxy calls before giving up on a paused sandbox.
func (m *Manager) AutoResume(ctx context.Context, id string) error {
	l, err := m.lookup(id)
	if err != nil {
		return err
	}
	m.mu.Lock()
	rec := l.rec
	m.mu.Unlock()
	if rec.State != StatePaused {
		return nil
	}
	if !rec.AutoResume {
		return fmt.Errorf("sandbox %q is paused and does not resume on traffic (resume it with connect): %w", id, ErrPaused)
	}
	_, _, err = m.Resume(ctx, id, DefaultTimeout, nil)
	return err
}

// expirePause pauses id at its end time when its lifecycle says so; it
// reports whether id needs nothing more (paused, or already paused).
func (m *Manager) expirePause(id string) bool {
	m.mu.Lock()
	l, ok := m.live[id]
	var rec Sandbox
	if ok {
		rec = l.rec
	}
	m.mu.Unlock()
	if !ok || rec.State == StatePaused {
		return ok
	}
	if !rec.AutoPause {
		return false
	}
	keep := rec.AutoPauseMemory == nil || *rec.AutoPauseMemory
	m.cfg.Log.Info("sandbox reached its end time; pausing it", "id", id)
	if _, err := m.Pause(context.Background(), id, keep); err != nil {
		if errors.Is(err, errdefs.ErrConflict) || errors.Is(err, errdefs.ErrNotFound) {
			return true
		}
		m.cfg.Log.Error("auto-pause failed; killing the sandbox", "id", id, "err", err)
		return false
	}
	return true
}

// recoverPaused takes over a paused sandbox of an earlier nook serve (and
// finishes a pause that a crash interrupted after the state was saved).
func (m *Manager) recoverPaused(ctx context.Context, rec Sandbox) bool {
	dir := m.pauseDir(rec.ID)
	pm, err := readPauseMeta(dir)
	if rec.State != StatePaused {
		if err != nil {
			return false
		}
		if info, ierr := m.cfg.Runtime.Inspect(ctx, rec.ID); ierr == nil && info.Running {
			return false // it runs: the saved state is stale
		}
		m.cfg.Log.Warn("sandbox was being paused when nook stopped; keeping it paused", "id", rec.ID)
		t := pm.PausedAt
		rec.State, rec.PauseMode, rec.PauseNote, rec.PausedAt = StatePaused, pm.Mode, pm.Note, &t
	} else if err != nil {
		m.cfg.Log.Error("paused sandbox has lost its saved state", "id", rec.ID, "err", err)
		return false
	}
	// Nothing of it may run or stay mounted while it is paused.
	if err := m.cfg.Runtime.Stop(ctx, rec.ID); err != nil {
		m.cfg.Log.Warn("stop leftovers of a paused sandbox", "id", rec.ID, "err", err)
	}
	if err := m.cfg.Store.Put(bucket, rec.ID, rec); err != nil {
		m.cfg.Log.Error("store paused sandbox", "id", rec.ID, "err", err)
	}
	m.mu.Lock()
	l := &live{rec: rec, agent: agentclient.New(m.socketPath(rec.ID))}
	m.live[rec.ID] = l
	m.armLocked(l)
	l.timer.Stop()
	m.mu.Unlock()
	m.cfg.Log.Info("kept paused sandbox", "id", rec.ID, "mode", rec.PauseMode)
	return true
}

// sweepStored removes saved state nothing refers to: pause dirs of unknown
// sandboxes and half-written ones (*.tmp). known are the sandbox ids
// Recover kept.
func (m *Manager) sweepStored(known map[string]bool) {
	entries, _ := os.ReadDir(m.pausedRoot())
	for _, e := range entries {
		name := e.Name()
		id := strings.TrimSuffix(name, ".tmp")
		if name != id || !known[id] || !m.isPaused(id) {
			m.cfg.Log.Warn("removing unused paused state", "dir", name)
			os.RemoveAll(filepath.Join(m.pausedRoot(), name))
		}
	}
	m.sweepSnapshots()
	m.sweepBackups()
}

func (m *Manager) isPaused(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.live[id]
	return ok && l.rec.State == StatePaused
}

// ErrCorrupt marks stored state (a snapshot, a backup archive) whose
// digest does not match its record: it is refused, never used.
var ErrCorrupt = fmt.Errorf("stored data is corrupted: %w", errdefs.ErrConflict)

func agentInit(rec Sandbox) agentclient.InitRequest {
	return agentclient.InitRequest{EnvVars: rec.EnvVars, AccessToken: rec.AccessToken}
}
