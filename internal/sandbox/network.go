package sandbox

import (
	"context"
	"fmt"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/runtime"
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
	// Mounts are files the sandbox needs (resolv.conf, CA bundle).
	Mounts []runtime.Mount
	// Env is added to the image environment (CA bundle variables).
	Env []string
}

// NetworkUpdater is a Network whose policy can change while the sandbox runs.
type NetworkUpdater interface {
	Update(ctx context.Context, id string, cfg NetworkConfig) error
}

// UpdateNetwork replaces a running sandbox's egress policy (E2B's
// PUT /sandboxes/{id}/network: omitted fields are cleared). It holds for
// new connections and requests.
func (m *Manager) UpdateNetwork(ctx context.Context, id string, cfg NetworkConfig) error {
	if _, err := m.lookup(id); err != nil {
		return err
	}
	u, ok := m.cfg.Network.(NetworkUpdater)
	if !ok || m.cfg.Network == nil {
		return fmt.Errorf("this nook serve runs without sandbox networking: %w", errdefs.ErrConflict)
	}
	return u.Update(ctx, id, cfg)
}
