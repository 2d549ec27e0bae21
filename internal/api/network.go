package api

import (
	"context"
	"fmt"
	"net/http"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/sandbox"
)

// networkRoutes registers the egress-policy endpoints: E2B's
// PUT /sandboxes/{id}/network and the native GET|PUT|PATCH
// /v1/sandboxes/{id}/network.
func (s *Server) networkRoutes(mux *http.ServeMux) {
	mux.HandleFunc("PUT /sandboxes/{id}/network", s.putNetworkE2B)
	mux.HandleFunc("GET /v1/sandboxes/{id}/network", s.getNetworkNative)
	mux.HandleFunc("PUT /v1/sandboxes/{id}/network", s.putNetworkNative)
	mux.HandleFunc("PATCH /v1/sandboxes/{id}/network", s.patchNetworkNative)
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

// nativeNetworkView is the policy as GET and PATCH answer it: every field
// present, rule header values shown as "***".
type nativeNetworkView struct {
	EnableInternet bool                             `json:"enableInternet"`
	AllowedHosts   []string                         `json:"allowedHosts"`
	DeniedHosts    []string                         `json:"deniedHosts"`
	AllowOut       []string                         `json:"allowOut"`
	DenyOut        []string                         `json:"denyOut"`
	Rules          map[string][]sandbox.NetworkRule `json:"rules"`
	Handlers       map[string]string                `json:"handlers"`
}

func networkView(cfg sandbox.NetworkConfig) nativeNetworkView {
	cfg = cfg.Redacted()
	nonNil := func(l []string) []string {
		if l == nil {
			return []string{}
		}
		return l
	}
	v := nativeNetworkView{
		EnableInternet: cfg.AllowInternet == nil || *cfg.AllowInternet,
		AllowedHosts:   nonNil(cfg.AllowedHosts), DeniedHosts: nonNil(cfg.DeniedHosts),
		AllowOut: nonNil(cfg.AllowOut), DenyOut: nonNil(cfg.DenyOut),
		Rules: cfg.Rules, Handlers: cfg.Handlers,
	}
	if v.Rules == nil {
		v.Rules = map[string][]sandbox.NetworkRule{}
	}
	if v.Handlers == nil {
		v.Handlers = map[string]string{}
	}
	return v
}

func (s *Server) getNetworkNative(w http.ResponseWriter, r *http.Request) {
	cfg, err := s.Sandboxes.NetworkOf(r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, networkView(cfg))
}

// patchNetworkNative changes only the fields the body has (the native
// body's names); it answers the whole new policy.
func (s *Server) patchNetworkNative(w http.ResponseWriter, r *http.Request) {
	var body sandbox.NetworkPatch
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	cfg, err := s.Sandboxes.PatchNetwork(context.WithoutCancel(r.Context()), r.PathValue("id"), body)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, networkView(cfg))
}
