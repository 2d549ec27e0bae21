package sandbox

import (
	"context"
	"fmt"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/runtime"
	"github.com/nookhq/nook/internal/template"
)

// NetworkRule is one E2B outbound rule: headers added to (or replacing
// those of) matching requests. The values are secrets nook holds.
type NetworkRule struct {
	Transform NetworkTransform `json:"transform"`
}

// NetworkTransform is what a rule changes in a request.
type NetworkTransform struct {
	Headers map[string]string `json:"headers,omitempty"`
}

// NetworkSetup is what a Network made for one sandbox.
type NetworkSetup struct {
	// NetNSPath is the network namespace the runtime joins.
	NetNSPath string
	// UserNSPath is the user namespace that owns NetNSPath; the runtime
	// joins it as the sandbox's user namespace.
	UserNSPath string
	// Mounts are files the sandbox needs (resolv.conf, CA bundle).
	Mounts []runtime.Mount
	// Env is added to the image environment (CA bundle variables).
	Env []string
}

// NetworkUpdater is a Network whose policy can change while the sandbox
// runs. Current returns a running sandbox's policy as a config, secrets
// included (false when the sandbox has no network now); Check validates a
// config without applying it.
type NetworkUpdater interface {
	Update(ctx context.Context, id string, cfg NetworkConfig) error
	Current(id string) (NetworkConfig, bool)
	Check(cfg NetworkConfig) error
}

// WithTemplateNetwork returns the network a sandbox of tpl starts with: the
// template's default egress policy (allowInternetAccess, allowOut,
// denyOut), where each field the create gave (cfg) replaces the
// template's value of that field. An empty but present list (allowOut: [])
// counts as given.
func WithTemplateNetwork(tpl template.Template, cfg NetworkConfig) NetworkConfig {
	d := tpl.NetworkDefaults
	if cfg.AllowInternet == nil && d.AllowInternetAccess != nil {
		v := *d.AllowInternetAccess
		cfg.AllowInternet = &v
	}
	if cfg.AllowOut == nil && len(d.AllowOut) > 0 {
		cfg.AllowOut = append([]string(nil), d.AllowOut...)
	}
	if cfg.DenyOut == nil && len(d.DenyOut) > 0 {
		cfg.DenyOut = append([]string(nil), d.DenyOut...)
	}
	return cfg
}

// NetworkPatch changes some fields of a sandbox's policy: a non-nil field
// replaces that field, the others stay.
type NetworkPatch struct {
	AllowInternet *bool                     `json:"enableInternet,omitempty"`
	AllowOut      *[]string                 `json:"allowOut,omitempty"`
	DenyOut       *[]string                 `json:"denyOut,omitempty"`
	AllowedHosts  *[]string                 `json:"allowedHosts,omitempty"`
	DeniedHosts   *[]string                 `json:"deniedHosts,omitempty"`
	Rules         *map[string][]NetworkRule `json:"rules,omitempty"`
	Handlers      *map[string]string        `json:"handlers,omitempty"`
}

// Apply returns cfg with p's fields replaced.
func (p NetworkPatch) Apply(cfg NetworkConfig) NetworkConfig {
	if p.AllowInternet != nil {
		v := *p.AllowInternet
		cfg.AllowInternet = &v
	}
	set := func(dst *[]string, src *[]string) {
		if src != nil {
			*dst = append([]string{}, (*src)...)
		}
	}
	set(&cfg.AllowOut, p.AllowOut)
	set(&cfg.DenyOut, p.DenyOut)
	set(&cfg.AllowedHosts, p.AllowedHosts)
	set(&cfg.DeniedHosts, p.DeniedHosts)
	if p.Rules != nil {
		cfg.Rules = *p.Rules
	}
	if p.Handlers != nil {
		cfg.Handlers = *p.Handlers
	}
	return cfg
}

// Redacted returns a copy of cfg safe to show: rule header values are
// replaced by "***".
func (cfg NetworkConfig) Redacted() NetworkConfig {
	if len(cfg.Rules) == 0 {
		return cfg
	}
	rules := map[string][]NetworkRule{}
	for k, rs := range cfg.Rules {
		for _, r := range rs {
			h := map[string]string{}
			for name := range r.Transform.Headers {
				h[name] = "***"
			}
			rules[k] = append(rules[k], NetworkRule{Transform: NetworkTransform{Headers: h}})
		}
	}
	cfg.Rules = rules
	return cfg
}

func (m *Manager) updater() (NetworkUpdater, error) {
	u, ok := m.cfg.Network.(NetworkUpdater)
	if !ok || m.cfg.Network == nil {
		return nil, fmt.Errorf("this nook serve runs without sandbox networking: %w", errdefs.ErrConflict)
	}
	return u, nil
}

// UpdateNetwork replaces a sandbox's egress policy (E2B's
// PUT /sandboxes/{id}/network: omitted fields are cleared, the template's
// defaults included). It holds for new connections and requests, and is
// kept in the sandbox's record, so that a resume, rollback or clone starts
// with it. A paused sandbox gets it when it resumes.
func (m *Manager) UpdateNetwork(ctx context.Context, id string, cfg NetworkConfig) error {
	if ValidID(id) {
		defer m.ops.lock(id)()
	}
	return m.setNetworkLocked(ctx, id, func(NetworkConfig) NetworkConfig { return cfg })
}

// PatchNetwork changes the given fields of a sandbox's egress policy and
// returns the new policy (secrets redacted).
func (m *Manager) PatchNetwork(ctx context.Context, id string, p NetworkPatch) (NetworkConfig, error) {
	if ValidID(id) {
		defer m.ops.lock(id)()
	}
	var out NetworkConfig
	err := m.setNetworkLocked(ctx, id, func(cur NetworkConfig) NetworkConfig {
		out = p.Apply(cur)
		return out
	})
	return out.Redacted(), err
}

// setNetworkLocked computes a sandbox's new policy from its current one and
// applies it. Preconditions: the sandbox's op lock held.
func (m *Manager) setNetworkLocked(ctx context.Context, id string, next func(NetworkConfig) NetworkConfig) error {
	l, err := m.lookup(id)
	if err != nil {
		return err
	}
	u, err := m.updater()
	if err != nil {
		return err
	}
	m.mu.Lock()
	rec := l.rec
	m.mu.Unlock()
	cur := NetworkConfig{}
	if rec.Network != nil {
		cur = *rec.Network
	}
	paused := rec.State == StatePaused
	if !paused {
		if c, ok := u.Current(id); ok {
			cur = c
		}
	}
	cfg := next(cur)
	if paused {
		// Checked now; applied by the resume's network setup.
		if err := u.Check(cfg); err != nil {
			return err
		}
	} else if err := u.Update(ctx, id, cfg); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.live[id] != l {
		return fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	rec = l.rec
	if isZeroNetwork(cfg) {
		rec.Network = nil
	} else {
		c := cfg
		rec.Network = &c
	}
	if err := m.cfg.Store.Put(bucket, id, rec); err != nil {
		return err
	}
	l.rec = rec
	return nil
}

// NetworkOf returns a sandbox's current egress policy, secrets redacted.
func (m *Manager) NetworkOf(id string) (NetworkConfig, error) {
	l, err := m.lookup(id)
	if err != nil {
		return NetworkConfig{}, err
	}
	u, err := m.updater()
	if err != nil {
		return NetworkConfig{}, err
	}
	m.mu.Lock()
	rec := l.rec
	m.mu.Unlock()
	if rec.State != StatePaused {
		if c, ok := u.Current(id); ok {
			return c.Redacted(), nil
		}
	}
	if rec.Network != nil {
		return rec.Network.Redacted(), nil
	}
	return NetworkConfig{}, nil
}
