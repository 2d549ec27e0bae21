package api

import (
	"context"
	"fmt"
	"net/http"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/sandbox"
)

// networkRoutes registers the egress-policy endpoints: E2B's
// PUT /sandboxes/{id}/network and the native PUT /v1/sandboxes/{id}/network.
func (s *Server) networkRoutes(mux *http.ServeMux) {
	mux.HandleFunc("PUT /sandboxes/{id}/network", s.putNetworkE2B)
	mux.HandleFunc("PUT /v1/sandboxes/{id}/network", s.putNetworkNative)
}

// e2bNetworkBody is E2B's SandboxNetworkConfig (create's `network`) and
// SandboxNetworkUpdateConfig (PUT; there allow_internet_access is inside).
type e2bNetworkBody struct {
	AllowInternetAccess *bool                            `json:"allow_internet_access"`
	AllowOut            []string                         `json:"allowOut"`
	DenyOut             []string                         `json:"denyOut"`
	Rules               map[string][]sandbox.NetworkRule `json:"rules"`
	AllowPublicTraffic  *bool                            `json:"allowPublicTraffic"`
	MaskRequestHost     *string                          `json:"maskRequestHost"`
	EgressProxy         *struct {
		Address string `json:"address"`
	} `json:"egressProxy"`
}

// networkConfig turns E2B's fields into the sandbox's config; allow is
// create's top-level allow_internet_access.
func (b *e2bNetworkBody) networkConfig(allow *bool) (sandbox.NetworkConfig, error) {
	if b == nil {
		return sandbox.NetworkConfig{AllowInternet: allow}, nil
	}
	if b.EgressProxy != nil && b.EgressProxy.Address != "" {
		return sandbox.NetworkConfig{}, fmt.Errorf("network.egressProxy is not supported by nook: %w", errdefs.ErrInvalid)
	}
	if b.AllowInternetAccess != nil {
		allow = b.AllowInternetAccess
	}
	return sandbox.NetworkConfig{AllowInternet: allow, AllowOut: b.AllowOut, DenyOut: b.DenyOut, Rules: b.Rules}, nil
}

func (s *Server) putNetworkE2B(w http.ResponseWriter, r *http.Request) {
	var body e2bNetworkBody
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	cfg, err := body.networkConfig(nil)
	if err == nil {
		err = s.Sandboxes.UpdateNetwork(context.WithoutCancel(r.Context()), r.PathValue("id"), cfg)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// nativeNetworkBody is nook's own policy shape (Cloudflare style plus
// E2B's CIDR lists and rules). Omitted fields are cleared.
type nativeNetworkBody struct {
	EnableInternet *bool                            `json:"enableInternet"`
	AllowedHosts   []string                         `json:"allowedHosts"`
	DeniedHosts    []string                         `json:"deniedHosts"`
	AllowOut       []string                         `json:"allowOut"`
	DenyOut        []string                         `json:"denyOut"`
	Rules          map[string][]sandbox.NetworkRule `json:"rules"`
	Handlers       map[string]string                `json:"handlers"`
}

func (b nativeNetworkBody) config() sandbox.NetworkConfig {
	return sandbox.NetworkConfig{
		AllowInternet: b.EnableInternet, AllowOut: b.AllowOut, DenyOut: b.DenyOut, Rules: b.Rules,
		AllowedHosts: b.AllowedHosts, DeniedHosts: b.DeniedHosts, Handlers: b.Handlers,
	}
}

func (s *Server) putNetworkNative(w http.ResponseWriter, r *http.Request) {
	var body nativeNetworkBody
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.Sandboxes.UpdateNetwork(context.WithoutCancel(r.Context()), r.PathValue("id"), body.config()); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
