package template

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nookhq/nook/internal/dockerfile"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/image"
	"github.com/nookhq/nook/internal/runtime"
	"github.com/nookhq/nook/internal/store"
)

const buildBucket = "template-builds"

// BuildRequest asks for a template made from an image or a Dockerfile.
type BuildRequest struct {
	// TemplateID rebuilds that template; Alias names (or finds) it.
	TemplateID string `json:"templateID,omitempty"`
	Alias      string `json:"alias,omitempty"`
	// Image is an image source: a registry reference, oci-layout:DIR,
	// oci-archive:FILE or docker-archive:FILE (paths on the server).
	Image            string `json:"image,omitempty"`
	RegistryUsername string `json:"registryUsername,omitempty"`
	RegistryPassword string `json:"registryPassword,omitempty"`
	// Dockerfile is a Dockerfile's text (instead of Image); its context is
	// uploaded beside the request.
	Dockerfile string            `json:"dockerfile,omitempty"`
	BuildArgs  map[string]string `json:"buildArgs,omitempty"`
	NoCache    bool              `json:"noCache,omitempty"`
	// Env (K=V) is merged over the image's Env: a name given here replaces
	// the image's value, every other image variable stays.
	Env []string `json:"env,omitempty"`
	// Cmd replaces the image's Entrypoint (and Cmd); Args replace its Cmd.
	Cmd               []string `json:"cmd,omitempty"`
	Args              []string `json:"args,omitempty"`
	CPUMillis         int64    `json:"cpuMillis,omitempty"`
	MemoryMB          int64    `json:"memoryMB,omitempty"`
	WritableLayerSize string   `json:"writableLayerSize,omitempty"` // e.g. "1G", "512M"
	ExposePorts       []int    `json:"exposePorts,omitempty"`
	ProbePort         int      `json:"probePort,omitempty"`
	ProbePath         string   `json:"probePath,omitempty"`
	ProbeTimeoutSec   int      `json:"probeTimeoutSeconds,omitempty"`
	DNS               []string `json:"dns,omitempty"`
	// NetworkDefaults (allowInternetAccess, allowOut, denyOut) is the
	// default egress policy of the template's sandboxes.
	NetworkDefaults
	// EnvdInheritImageEnv lets envd commands and PTYs see the image env;
	// RunCodeInheritSandboxEnv lets run_code see the sandbox env (for a
	// template with a code interpreter). Both off by default, as the
	// CubeSandbox table says.
	EnvdInheritImageEnv      bool `json:"envdInheritImageEnv,omitempty"`
	RunCodeInheritSandboxEnv bool `json:"runCodeInheritSandboxEnv,omitempty"`
}

// Build is the record of one build of a template.
type Build struct {
	TemplateID string     `json:"templateID"`
	BuildID    string     `json:"buildID"`
	State      string     `json:"state"`
	Reason     string     `json:"reason,omitempty"`
	Step       string     `json:"step,omitempty"` // what the build does now
	Layers     int        `json:"layers"`         // image layers to pull
	LayersDone int        `json:"layersDone"`
	Bytes      int64      `json:"bytes"` // bytes unpacked
	StartedAt  time.Time  `json:"startedAt"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
	// StoredLayers are the layers a READY build made the template of, so
	// that deleting the template also frees those of its older versions.
	StoredLayers []string `json:"layerPaths,omitempty"`
}

// Runner runs a Dockerfile RUN step (the runc driver's RunOnce).
type Runner interface {
	RunOnce(ctx context.Context, s runtime.Spec, user, scratch string, out io.Writer) (int, error)
}

// BuilderConfig wires a Builder to the rest of nook serve.
type BuilderConfig struct {
	Runner Runner
	// Probe starts a sandbox of the template id, waits for its probe and
	// kills it.
	Probe func(ctx context.Context, templateID string) error
	// InUse lists the running sandboxes of a template.
	InUse func(templateID string) []string
	// Drain kills the warm (pooled) sandboxes of a template.
	Drain func(ctx context.Context, templateID string)
	Log   *slog.Logger
}

// Builder runs template builds in the background.
type Builder struct {
	reg    *Registry
	Layers *image.Store
	cfg    BuilderConfig
	logDir string

	mu      sync.Mutex
	running map[string]*run // by template id
}

type run struct {
	build  Build
	cancel context.CancelFunc
	done   chan struct{}
}

// NewBuilder returns the builder of reg. Builds an earlier nook serve left
// unfinished are marked FAILED.
func NewBuilder(reg *Registry, cfg BuilderConfig) (*Builder, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	layers, err := image.NewStore(reg.DataDir())
	if err != nil {
		return nil, err
	}
	if err := layers.CleanTmp(); err != nil {
		return nil, err
	}
	b := &Builder{reg: reg, Layers: layers, cfg: cfg, logDir: filepath.Join(reg.DataDir(), "builds"), running: map[string]*run{}}
	if err := os.MkdirAll(b.logDir, 0o700); err != nil {
		return nil, err
	}
	const interrupted = "interrupted: nook serve stopped during the build"
	builds, err := store.All[Build](reg.st, buildBucket)
	if err != nil {
		return nil, err
	}
	for _, bd := range builds {
		if bd.State != StateReady && bd.State != StateFailed {
			bd.State, bd.Reason = StateFailed, interrupted
			now := time.Now().UTC()
			bd.FinishedAt = &now
			reg.st.Put(buildBucket, buildKey(bd.TemplateID, bd.BuildID), bd)
		}
	}
	all, err := reg.List()
	if err != nil {
		return nil, err
	}
	for _, t := range all {
		switch {
		case t.Internal:
			reg.Delete(t.ID)
		case t.State == StatePulling || t.State == StateBuilding:
			t.State, t.Reason = StateFailed, interrupted
			reg.Put(t)
		}
	}
	return b, nil
}

func buildKey(templateID, buildID string) string { return templateID + "/" + buildID }

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// newTemplateID returns an E2B-shaped template id (20 chars of [a-z0-9]).
func newTemplateID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// ParseSize parses a size like "1G", "512M", "1.5GiB" or a number of bytes
// and returns it in MiB.
func ParseSize(s string) (int64, error) {
	s = strings.TrimSpace(strings.ToUpper(s))
	s = strings.TrimSuffix(strings.TrimSuffix(s, "B"), "I")
	mult := float64(1)
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'K':
			mult, s = 1<<10, s[:n-1]
		case 'M':
			mult, s = 1<<20, s[:n-1]
		case 'G':
			mult, s = 1<<30, s[:n-1]
		case 'T':
			mult, s = 1<<40, s[:n-1]
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("size %q: want e.g. 512M or 1G: %w", s, errdefs.ErrInvalid)
	}
	mb := int64(v * mult / (1 << 20))
	if mb < 1 {
		return 0, fmt.Errorf("size %q: at least 1M: %w", s, errdefs.ErrInvalid)
	}
	return mb, nil
}

// apply fills a template's run configuration from the image config and the
// request's overrides.
func apply(t *Template, cfg image.Config, req BuildRequest) error {
	env := append([]string(nil), cfg.Env...)
	for _, kv := range req.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsRune(kv, 0) {
			return fmt.Errorf("env %q: want NAME=VALUE: %w", kv, errdefs.ErrInvalid)
		}
		env = setEnv(env, k, v)
	}
	hasPath := false
	for _, kv := range env {
		hasPath = hasPath || strings.HasPrefix(kv, "PATH=")
	}
	if !hasPath {
		env = append(env, DefaultPath)
	}
	t.Env = env
	entry, cmd := cfg.Entrypoint, cfg.Cmd
	if len(req.Cmd) > 0 {
		entry, cmd = req.Cmd, nil
	}
	if len(req.Args) > 0 {
		cmd = req.Args
	}
	t.Cmd = append(append([]string(nil), entry...), cmd...)
	t.WorkingDir, t.User = cfg.WorkingDir, cfg.User
	ports := map[int]bool{}
	for _, p := range append(append([]int(nil), cfg.ExposedPorts...), req.ExposePorts...) {
		ports[p] = true
	}
	t.ExposedPorts = nil
	for p := range ports {
		t.ExposedPorts = append(t.ExposedPorts, p)
	}
	sort.Ints(t.ExposedPorts)
	return nil
}

func setEnv(env []string, k, v string) []string {
	for i, kv := range env {
		if name, _, _ := strings.Cut(kv, "="); name == k {
			env[i] = k + "=" + v
			return env
		}
	}
	return append(env, k+"="+v)
}

// validate checks a request and fills defaults.
func (b *Builder) validate(req *BuildRequest) error {
	if (req.Image == "") == (req.Dockerfile == "") {
		return fmt.Errorf("give exactly one of image and dockerfile: %w", errdefs.ErrInvalid)
	}
	if req.Alias != "" && !ValidID(req.Alias) {
		return fmt.Errorf("alias %q: want 1-63 of a-z, 0-9, '-', '_', starting with a letter or digit: %w", req.Alias, errdefs.ErrInvalid)
	}
	if req.TemplateID != "" && !ValidID(req.TemplateID) {
		return fmt.Errorf("template id %q: %w", req.TemplateID, errdefs.ErrInvalid)
	}
	if req.CPUMillis < 0 || req.CPUMillis > 256000 || req.MemoryMB < 0 || (req.MemoryMB > 0 && req.MemoryMB < 16) {
		return fmt.Errorf("cpu must be 1-256000 millicores and memory at least 16 MB: %w", errdefs.ErrInvalid)
	}
	if req.ProbePort < 0 || req.ProbePort > 65535 {
		return fmt.Errorf("probe port %d: %w", req.ProbePort, errdefs.ErrInvalid)
	}
	if req.ProbePath != "" && !strings.HasPrefix(req.ProbePath, "/") {
		return fmt.Errorf("probe path %q must start with '/': %w", req.ProbePath, errdefs.ErrInvalid)
	}
	for _, p := range req.ExposePorts {
		if p < 1 || p > 65535 {
			return fmt.Errorf("expose port %d: %w", p, errdefs.ErrInvalid)
		}
	}
	var err error
	if req.AllowOut, err = NormalizeCIDRs("allowOut (--allow-out-cidr)", req.AllowOut); err != nil {
		return err
	}
	if req.DenyOut, err = NormalizeCIDRs("denyOut (--deny-out-cidr)", req.DenyOut); err != nil {
		return err
	}
	if req.WritableLayerSize != "" {
		if _, err := ParseSize(req.WritableLayerSize); err != nil {
			return err
		}
	}
	if err := apply(&Template{}, image.Config{}, *req); err != nil {
		return err
	}
	if image.IsLocal(req.Image) {
		p := req.Image[strings.Index(req.Image, ":")+1:]
		if !filepath.IsAbs(p) {
			return fmt.Errorf("image %q: a local source needs an absolute path on the server: %w", req.Image, errdefs.ErrInvalid)
		}
	}
	return nil
}

// Start validates req, records a new build and runs it in the background.
// contextDir (for Dockerfile builds) is taken over and removed when the
// build ends.
func (b *Builder) Start(req BuildRequest, contextDir string) (Build, error) {
	fail := func(err error) (Build, error) {
		if contextDir != "" {
			os.RemoveAll(contextDir)
		}
		return Build{}, err
	}
	if err := b.validate(&req); err != nil {
		return fail(err)
	}
	var instrs []dockerfile.Instruction
	if req.Dockerfile != "" {
		var err error
		if instrs, err = dockerfile.Parse(req.Dockerfile); err != nil {
			return fail(err)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var t Template
	existing := false
	switch {
	case req.TemplateID != "":
		var err error
		if t, err = b.reg.Get(req.TemplateID); err != nil {
			return fail(err)
		}
		existing = true
	case req.Alias != "":
		if c, err := b.reg.Get(req.Alias); err == nil {
			t, existing = c, true
		}
	}
	if existing && t.Internal {
		return fail(fmt.Errorf("template %q: %w", t.ID, errdefs.ErrNotFound))
	}
	if !existing {
		t = Template{ID: newTemplateID(), State: StatePulling, CreatedAt: time.Now().UTC()}
		if req.Alias != "" {
			t.Aliases = []string{req.Alias}
		}
	} else if req.Alias != "" && !contains(t.Aliases, req.Alias) && t.ID != req.Alias {
		t.Aliases = append(t.Aliases, req.Alias)
	}
	if r, ok := b.running[t.ID]; ok {
		return fail(fmt.Errorf("template %q has a build in progress (%s): %w", t.ID, r.build.BuildID, errdefs.ErrConflict))
	}
	bd := Build{TemplateID: t.ID, BuildID: randomHex(8), State: StatePulling, StartedAt: time.Now().UTC()}
	t.BuildID = bd.BuildID
	if !existing || t.State != StateReady {
		t.State, t.Reason = StatePulling, ""
	}
	if err := b.reg.Put(t); err != nil {
		return fail(err)
	}
	if err := b.reg.st.Put(buildBucket, buildKey(t.ID, bd.BuildID), bd); err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &run{build: bd, cancel: cancel, done: make(chan struct{})}
	b.running[t.ID] = r
	go b.run(ctx, r, req, instrs, contextDir)
	return bd, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// update changes the running build's record (in memory; persist saves it).
func (b *Builder) update(r *run, fn func(*Build)) {
	b.mu.Lock()
	fn(&r.build)
	b.mu.Unlock()
}

func (b *Builder) persist(r *run) {
	b.mu.Lock()
	bd := r.build
	b.mu.Unlock()
	if err := b.reg.st.Put(buildBucket, buildKey(bd.TemplateID, bd.BuildID), bd); err != nil {
		b.cfg.Log.Error("store build", "build", bd.BuildID, "err", err)
	}
}

func (b *Builder) logPath(buildID string) string { return filepath.Join(b.logDir, buildID+".log") }

// setState moves the build and, unless it replaces a READY version, the
// template to state.
func (b *Builder) setState(r *run, state string) {
	b.update(r, func(bd *Build) { bd.State = state })
	b.persist(r)
	if t, err := b.reg.Get(r.build.TemplateID); err == nil && t.State != StateReady && t.BuildID == r.build.BuildID {
		t.State = state
		b.reg.Put(t)
	}
}

func (b *Builder) run(ctx context.Context, r *run, req BuildRequest, instrs []dockerfile.Instruction, contextDir string) {
	start := time.Now()
	id := r.build.TemplateID
	logf, _ := os.OpenFile(b.logPath(r.build.BuildID), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	var logw io.Writer = io.Discard
	if logf != nil {
		logw = logf
	}
	logw = &syncWriter{w: logw}
	say := func(format string, a ...any) {
		fmt.Fprintf(logw, time.Now().UTC().Format("15:04:05.000")+" "+format+"\n", a...)
	}
	err := b.build(ctx, r, req, instrs, contextDir, say, logw)
	if contextDir != "" {
		os.RemoveAll(contextDir)
	}
	now := time.Now().UTC()
	if err != nil {
		reason := err.Error()
		if errors.Is(err, context.Canceled) {
			reason = "canceled"
		}
		say("FAILED: %s", reason)
		b.update(r, func(bd *Build) { bd.State, bd.Reason, bd.FinishedAt = StateFailed, reason, &now })
		if t, gerr := b.reg.Get(id); gerr == nil && t.BuildID == r.build.BuildID && t.State != StateReady {
			t.State, t.Reason = StateFailed, reason
			b.reg.Put(t)
		}
		b.cfg.Log.Warn("template build failed", "template", id, "build", r.build.BuildID, "err", reason)
	} else {
		say("READY in %s", time.Since(start).Round(time.Millisecond))
		b.update(r, func(bd *Build) { bd.State, bd.Step, bd.FinishedAt = StateReady, "", &now })
		b.cfg.Log.Info("template ready", "template", id, "build", r.build.BuildID, "took", time.Since(start).Round(time.Millisecond))
	}
	b.persist(r)
	if logf != nil {
		logf.Close()
	}
	b.mu.Lock()
	delete(b.running, id)
	b.mu.Unlock()
	close(r.done)
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func (b *Builder) pull(ctx context.Context, r *run, ref string, auth image.Auth, say func(string, ...any)) ([]string, image.Config, string, error) {
	say("pulling %s", ref)
	b.update(r, func(bd *Build) { bd.Step = "resolving " + ref })
	src, err := image.Open(ctx, ref, auth, b.Layers.TmpDir())
	if err != nil {
		return nil, image.Config{}, "", err
	}
	defer src.Close()
	digest, _ := src.Image.Digest()
	say("image %s", digest)
	var base int64
	b.update(r, func(bd *Build) { base = bd.Bytes })
	layers, err := b.Layers.Pull(ctx, src.Image, func(p image.Progress) {
		b.update(r, func(bd *Build) {
			bd.Layers, bd.Bytes = p.Layers, base+p.TotalBytes
			bd.Step = fmt.Sprintf("layer %d/%d %s", p.Layer, p.Layers, short(p.Digest))
			if p.Done {
				bd.LayersDone = p.Layer
			}
		})
		switch {
		case p.Done && p.Cached:
			say("layer %d/%d %s: already present", p.Layer, p.Layers, short(p.Digest))
		case p.Done:
			say("layer %d/%d %s: unpacked %s", p.Layer, p.Layers, short(p.Digest), humanBytes(p.Bytes))
		}
	})
	if err != nil {
		return nil, image.Config{}, "", err
	}
	cfg, err := image.ConfigOf(src.Image)
	return layers, cfg, digest.String(), err
}

func short(d string) string {
	_, hex, _ := strings.Cut(d, ":")
	if len(hex) > 12 {
		return hex[:12]
	}
	return d
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func (b *Builder) build(ctx context.Context, r *run, req BuildRequest, instrs []dockerfile.Instruction, contextDir string, say func(string, ...any), logw io.Writer) error {
	auth := image.Auth{Username: req.RegistryUsername, Password: req.RegistryPassword}
	var layers []string
	var cfg image.Config
	source := req.Image
	var fromTpl *Template // FROM a template: its code interpreter carries over
	if req.Dockerfile == "" {
		var err error
		if layers, cfg, _, err = b.pull(ctx, r, req.Image, auth, say); err != nil {
			return err
		}
		b.setState(r, StateBuilding)
	} else {
		source = "dockerfile"
		opts := dockerfile.Options{
			Store: b.Layers, BuildArgs: req.BuildArgs, NoCache: req.NoCache, Log: logw,
			From: func(ctx context.Context, ref string) (dockerfile.Base, error) {
				defer b.setState(r, StateBuilding)
				if ValidID(ref) {
					if t, err := b.reg.Get(ref); err == nil && !t.Internal {
						if t.State != StateReady {
							return dockerfile.Base{}, fmt.Errorf("template %q is %s, not READY: %w", ref, t.State, errdefs.ErrConflict)
						}
						say("FROM template %s", t.ID)
						fromTpl = &t
						return dockerfile.Base{
							Layers: t.Layers,
							Config: image.Config{Env: t.Env, Cmd: t.Cmd, WorkingDir: t.WorkingDir, User: t.User, ExposedPorts: t.ExposedPorts},
							Key:    "template:" + t.ID + ":" + strings.Join(t.Layers, ":") + ":" + t.CreatedAt.String(),
						}, nil
					}
				}
				l, c, digest, err := b.pull(ctx, r, ref, auth, say)
				return dockerfile.Base{Layers: l, Config: c, Key: "image:" + digest}, err
			},
			Run: func(ctx context.Context, s dockerfile.RunSpec, out io.Writer) (int, error) {
				if b.cfg.Runner == nil {
					return 0, errors.New("RUN needs a runtime")
				}
				b.update(r, func(bd *Build) { bd.Step = "RUN " + strings.Join(s.Args, " ") })
				mem := req.MemoryMB
				if mem == 0 {
					mem = DefaultMemoryMB
				}
				spec := runtime.Spec{
					ID: "build" + randomHex(8), Hostname: "build", Layers: s.Layers, Args: s.Args, Env: s.Env, Cwd: s.Cwd,
					Limits: runtime.Limits{CPUMillis: req.CPUMillis, MemoryBytes: mem << 20, PidsMax: 4096, WritableBytes: 1},
				}
				return b.cfg.Runner.RunOnce(ctx, spec, s.User, s.Scratch, out)
			},
		}
		res, err := dockerfile.Build(ctx, instrs, contextDir, opts)
		if err != nil {
			return err
		}
		say("%d steps, %d from cache", res.Steps, res.Cached)
		layers, cfg = res.Layers, res.Config
	}
	if len(layers) == 0 {
		return fmt.Errorf("the image has no files: %w", errdefs.ErrInvalid)
	}
	b.update(r, func(bd *Build) { bd.Step = "configuring" })
	t, err := b.reg.Get(r.build.TemplateID)
	if err != nil {
		return err
	}
	t.Layers, t.Source, t.UpdatedAt, t.Reason = layers, source, time.Now().UTC(), ""
	if err := apply(&t, cfg, req); err != nil {
		return err
	}
	t.CPUMillis, t.MemoryMB, t.DiskMB, t.PidsMax = DefaultCPUMillis, DefaultMemoryMB, DefaultDiskMB, DefaultPidsMax
	if req.CPUMillis > 0 {
		t.CPUMillis = req.CPUMillis
	}
	if req.MemoryMB > 0 {
		t.MemoryMB = req.MemoryMB
	}
	if req.WritableLayerSize != "" {
		t.DiskMB, _ = ParseSize(req.WritableLayerSize)
	}
	t.ProbePort, t.ProbePath, t.ProbeTimeout = req.ProbePort, req.ProbePath, time.Duration(req.ProbeTimeoutSec)*time.Second
	t.CodeInterpreter = fromTpl != nil && fromTpl.CodeInterpreter
	if t.CodeInterpreter && t.ProbePort == 0 {
		// run_code must answer before a create does, as in the base.
		t.ProbePort, t.ProbePath, t.ProbeTimeout = fromTpl.ProbePort, fromTpl.ProbePath, fromTpl.ProbeTimeout
	}
	if t.ProbePort > 0 && t.ProbePath == "" {
		t.ProbePath = "/health"
	}
	t.DNS = req.DNS
	t.NetworkDefaults = req.NetworkDefaults
	t.EnvdInheritImageEnv, t.RunCodeInheritSandboxEnv = req.EnvdInheritImageEnv, req.RunCodeInheritSandboxEnv
	if !t.NetworkDefaults.IsZero() {
		say("default egress policy: internet %v, allow %v, deny %v", t.AllowInternetAccess == nil || *t.AllowInternetAccess, t.AllowOut, t.DenyOut)
	}
	say("layers: %d; cmd: %q; workdir: %q; user: %q", len(t.Layers), t.Cmd, t.WorkingDir, t.User)
	if t.ProbePort > 0 {
		// The probe runs on a hidden copy, so that a READY version of the
		// template keeps serving until this one has passed.
		b.update(r, func(bd *Build) { bd.Step = fmt.Sprintf("probing port %d %s", t.ProbePort, t.ProbePath) })
		say("starting a sandbox to probe port %d %s", t.ProbePort, t.ProbePath)
		probe := t
		probe.ID, probe.Aliases, probe.Internal, probe.State = "probe-"+r.build.BuildID, nil, true, StateReady
		zero := 0
		probe.PoolSize = &zero
		if err := b.reg.Put(probe); err != nil {
			return err
		}
		pstart := time.Now()
		err := b.cfg.Probe(ctx, probe.ID)
		b.reg.Delete(probe.ID)
		if err != nil {
			return fmt.Errorf("probe: %w", err)
		}
		say("probe passed in %s", time.Since(pstart).Round(time.Millisecond))
	}
	t.State = StateReady
	b.update(r, func(bd *Build) { bd.StoredLayers = t.Layers })
	if b.cfg.Drain != nil {
		b.cfg.Drain(ctx, t.ID) // warm sandboxes of an older version
	}
	return b.reg.Put(t)
}

// Status returns a build's record.
func (b *Builder) Status(templateID, buildID string) (Build, error) {
	b.mu.Lock()
	if r, ok := b.running[templateID]; ok && r.build.BuildID == buildID {
		bd := r.build
		b.mu.Unlock()
		return bd, nil
	}
	b.mu.Unlock()
	var bd Build
	if err := b.reg.st.Get(buildBucket, buildKey(templateID, buildID), &bd); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return Build{}, fmt.Errorf("build %q of template %q: %w", buildID, templateID, errdefs.ErrNotFound)
		}
		return Build{}, err
	}
	return bd, nil
}

// Builds lists a template's builds, newest first.
func (b *Builder) Builds(templateID string) ([]Build, error) {
	all, err := store.All[Build](b.reg.st, buildBucket)
	if err != nil {
		return nil, err
	}
	var out []Build
	for _, bd := range all {
		if bd.TemplateID == templateID {
			if live, err := b.Status(bd.TemplateID, bd.BuildID); err == nil {
				bd = live
			}
			out = append(out, bd)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].StartedAt.After(out[j].StartedAt) })
	return out, nil
}

// Logs returns a build's log lines from line offset on.
func (b *Builder) Logs(templateID, buildID string, offset int) ([]string, error) {
	if _, err := b.Status(templateID, buildID); err != nil {
		return nil, err
	}
	f, err := os.Open(b.logPath(buildID))
	if errors.Is(err, os.ErrNotExist) {
		return []string{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := []string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for i := 0; sc.Scan(); i++ {
		if i >= offset {
			out = append(out, sc.Text())
		}
	}
	return out, nil
}

// Delete removes a template that no running sandbox uses: it cancels a
// build in progress, kills its warm sandboxes and removes the layers no
// other template uses.
func (b *Builder) Delete(ctx context.Context, idOrAlias string) error {
	t, err := b.reg.Get(idOrAlias)
	if err != nil {
		return err
	}
	if t.Internal {
		return fmt.Errorf("template %q: %w", idOrAlias, errdefs.ErrNotFound)
	}
	if b.cfg.InUse != nil {
		if ids := b.cfg.InUse(t.ID); len(ids) > 0 {
			return fmt.Errorf("template %q is used by %d running sandbox(es) (%s); kill them first: %w",
				t.ID, len(ids), strings.Join(ids, ", "), errdefs.ErrConflict)
		}
	}
	b.mu.Lock()
	r := b.running[t.ID]
	b.mu.Unlock()
	if r != nil {
		r.cancel()
		<-r.done
	}
	if b.cfg.Drain != nil {
		b.cfg.Drain(ctx, t.ID)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.reg.Delete(t.ID); err != nil {
		return err
	}
	candidates := append([]string(nil), t.Layers...)
	builds, _ := store.All[Build](b.reg.st, buildBucket)
	for _, bd := range builds {
		if bd.TemplateID == t.ID {
			candidates = append(candidates, bd.StoredLayers...)
			b.reg.st.Delete(buildBucket, buildKey(bd.TemplateID, bd.BuildID))
			os.Remove(b.logPath(bd.BuildID))
		}
	}
	return b.gcLocked(candidates)
}

// gcLocked removes the store's layers among candidates that no template
// uses any more. Preconditions: b.mu held.
func (b *Builder) gcLocked(candidates []string) error {
	all, err := b.reg.List()
	if err != nil {
		return err
	}
	used := map[string]bool{}
	for _, t := range all {
		for _, l := range t.Layers {
			used[l] = true
		}
	}
	// A running build may be about to use a layer: keep everything while
	// one runs.
	if len(b.running) > 0 {
		return nil
	}
	for _, l := range candidates {
		if !used[l] && b.Layers.Owns(l) {
			if err := b.Layers.Remove(l); err != nil {
				return err
			}
		}
	}
	return nil
}

// Patch changes a template's aliases and resources.
type Patch struct {
	Aliases           *[]string `json:"aliases,omitempty"`
	CPUMillis         *int64    `json:"cpuMillis,omitempty"`
	MemoryMB          *int64    `json:"memoryMB,omitempty"`
	WritableLayerSize *string   `json:"writableLayerSize,omitempty"`
	// The default egress policy and env opt-ins (see BuildRequest); a
	// given field replaces the template's.
	AllowInternetAccess      *bool     `json:"allowInternetAccess,omitempty"`
	AllowOut                 *[]string `json:"allowOut,omitempty"`
	DenyOut                  *[]string `json:"denyOut,omitempty"`
	EnvdInheritImageEnv      *bool     `json:"envdInheritImageEnv,omitempty"`
	RunCodeInheritSandboxEnv *bool     `json:"runCodeInheritSandboxEnv,omitempty"`
}

// Update applies p to a template.
func (b *Builder) Update(ctx context.Context, idOrAlias string, p Patch) (Template, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, err := b.reg.Get(idOrAlias)
	if err != nil || t.Internal {
		return Template{}, fmt.Errorf("template %q: %w", idOrAlias, errdefs.ErrNotFound)
	}
	if p.Aliases != nil {
		all, err := b.reg.List()
		if err != nil {
			return Template{}, err
		}
		for _, a := range *p.Aliases {
			if !ValidID(a) {
				return Template{}, fmt.Errorf("alias %q: %w", a, errdefs.ErrInvalid)
			}
			for _, o := range all {
				if o.ID != t.ID && (o.ID == a || contains(o.Aliases, a)) {
					return Template{}, fmt.Errorf("alias %q belongs to template %q: %w", a, o.ID, errdefs.ErrConflict)
				}
			}
		}
		t.Aliases = append([]string(nil), *p.Aliases...)
	}
	if p.CPUMillis != nil {
		if *p.CPUMillis <= 0 {
			return Template{}, fmt.Errorf("cpu must be positive: %w", errdefs.ErrInvalid)
		}
		t.CPUMillis = *p.CPUMillis
	}
	if p.MemoryMB != nil {
		if *p.MemoryMB < 16 {
			return Template{}, fmt.Errorf("memory must be at least 16 MB: %w", errdefs.ErrInvalid)
		}
		t.MemoryMB = *p.MemoryMB
	}
	if p.WritableLayerSize != nil {
		if t.DiskMB, err = ParseSize(*p.WritableLayerSize); err != nil {
			return Template{}, err
		}
	}
	if p.AllowInternetAccess != nil {
		t.AllowInternetAccess = p.AllowInternetAccess
	}
	if p.AllowOut != nil {
		if t.AllowOut, err = NormalizeCIDRs("allowOut", *p.AllowOut); err != nil {
			return Template{}, err
		}
	}
	if p.DenyOut != nil {
		if t.DenyOut, err = NormalizeCIDRs("denyOut", *p.DenyOut); err != nil {
			return Template{}, err
		}
	}
	if p.EnvdInheritImageEnv != nil {
		t.EnvdInheritImageEnv = *p.EnvdInheritImageEnv
	}
	if p.RunCodeInheritSandboxEnv != nil {
		t.RunCodeInheritSandboxEnv = *p.RunCodeInheritSandboxEnv
	}
	t.UpdatedAt = time.Now().UTC()
	if err := b.reg.Put(t); err != nil {
		return Template{}, err
	}
	if b.cfg.Drain != nil {
		b.cfg.Drain(ctx, t.ID)
	}
	return t, nil
}

// Wait blocks until the template's running build ends (for tests).
func (b *Builder) Wait(templateID string) {
	b.mu.Lock()
	r := b.running[templateID]
	b.mu.Unlock()
	if r != nil {
		<-r.done
	}
}
