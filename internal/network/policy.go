package network

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/sandbox"
)

// Policy is one sandbox's egress policy. It merges E2B's network config
// (allow_internet_access, allowOut, denyOut, rules) and the Cloudflare-style
// native one (enableInternet, allowedHosts, deniedHosts, per-host handlers).
type Policy struct {
	// AllowInternet is enableInternet / allow_internet_access.
	AllowInternet bool `json:"allowInternet"`
	// AllowCIDRs and DenyCIDRs are E2B's allowOut/denyOut IP entries
	// (--allow-out-cidr / --deny-out-cidr). Allow wins over deny.
	AllowCIDRs []netip.Prefix `json:"allowCIDRs,omitempty"`
	DenyCIDRs  []netip.Prefix `json:"denyCIDRs,omitempty"`
	// AllowHosts are host globs that are allowed even where the CIDR rules
	// or a disabled internet would refuse (E2B allowOut domains).
	AllowHosts []string `json:"allowHosts,omitempty"`
	// GateHosts is the native allowedHosts: when non-empty, a host that
	// matches none of them (and no handler) is refused.
	GateHosts []string `json:"gateHosts,omitempty"`
	// DenyHosts are host globs that are always refused (deniedHosts).
	DenyHosts []string `json:"denyHosts,omitempty"`
	// Rules are E2B's rules: host pattern -> header transforms. Header
	// values are secrets: never returned by the API or shown in the sandbox.
	Rules map[string][]Rule `json:"rules,omitempty"`
	// Handlers map a host pattern ("*" = catch-all) to an HTTP URL that
	// answers the sandbox's requests for that host instead of the host.
	Handlers map[string]string `json:"handlers,omitempty"`
}

// Rule is one E2B outbound rule.
type Rule struct {
	Transform Transform `json:"transform"`
}

// Transform says how a matching request is changed.
type Transform struct {
	Headers map[string]string `json:"headers,omitempty"`
}

// DefaultPolicy is a sandbox with internet access and no other rule.
func DefaultPolicy() Policy { return Policy{AllowInternet: true} }

// Hostful reports whether the policy needs hosts (HTTP Host / TLS SNI) to
// decide: only then are a sandbox's ports 80 and 443 sent through the
// transparent proxy.
func (p *Policy) Hostful() bool {
	return len(p.AllowHosts)+len(p.GateHosts)+len(p.DenyHosts)+len(p.Rules)+len(p.Handlers) > 0
}

// ParseTargets splits E2B allowOut/denyOut entries into CIDRs (a bare IP is
// a /32 or /128) and host globs (lowercased; "*.example.com" or exact).
func ParseTargets(entries []string) (cidrs []netip.Prefix, hosts []string, err error) {
	for _, e := range entries {
		e = strings.TrimSpace(e)
		if e == "" {
			return nil, nil, fmt.Errorf("empty network target: %w", errdefs.ErrInvalid)
		}
		if p, err := netip.ParsePrefix(e); err == nil {
			cidrs = append(cidrs, p.Masked())
			continue
		}
		if a, err := netip.ParseAddr(e); err == nil {
			cidrs = append(cidrs, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		h, err := NormalizeHostPattern(e)
		if err != nil {
			return nil, nil, err
		}
		hosts = append(hosts, h)
	}
	return cidrs, hosts, nil
}

// NormalizeHostPattern checks and lowercases a host glob: an exact name,
// "*" or "*.suffix".
func NormalizeHostPattern(s string) (string, error) {
	h := strings.ToLower(strings.TrimSuffix(strings.TrimSpace(s), "."))
	if h == "*" {
		return h, nil
	}
	rest := strings.TrimPrefix(h, "*.")
	if rest == "" || strings.Contains(rest, "*") || strings.ContainsAny(rest, " /:@\\") || strings.Contains(rest, "..") {
		return "", fmt.Errorf("invalid host pattern %q (want an IP, a CIDR, a name or *.name): %w", s, errdefs.ErrInvalid)
	}
	return h, nil
}

// matchHost reports whether host matches pattern p, and how specific the
// match is (exact > longer wildcard > shorter wildcard > "*").
func matchHost(p, host string) (bool, int) {
	switch {
	case p == "*":
		return true, 0
	case strings.HasPrefix(p, "*."):
		suf := p[1:] // ".example.com"
		if strings.HasSuffix(host, suf) {
			return true, len(suf)
		}
		return false, 0
	default:
		return p == host, 1 << 20
	}
}

func anyHost(patterns []string, host string) bool {
	for _, p := range patterns {
		if ok, _ := matchHost(p, host); ok {
			return true
		}
	}
	return false
}

// best returns the most specific key of m matching host ("" if none).
func best[V any](m map[string]V, host string) (string, bool) {
	bestKey, bestScore, found := "", -1, false
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if ok, score := matchHost(k, host); ok && score > bestScore {
			bestKey, bestScore, found = k, score, true
		}
	}
	return bestKey, found
}

// NormalizeHost lowercases a Host/SNI value and strips a port and a
// trailing dot.
func NormalizeHost(h string) string {
	if host, _, ok := strings.Cut(h, ":"); ok && !strings.HasPrefix(h, "[") {
		h = host
	}
	return strings.ToLower(strings.TrimSuffix(h, "."))
}

// Verdict is the outcome of evaluating one request.
type Verdict struct {
	Allow   bool
	Handler string // non-empty: forward to this URL instead
	Rule    string // why (for logs and refusals)
}

// Evaluate decides a request for host (may be empty when unknown) to addr
// (may be invalid when not yet resolved), in the order of the seed summary:
// denied hosts, the allowed-hosts gate, the per-host handler, the
// catch-all handler, allowed hosts (and allowed CIDRs), denied CIDRs and
// blocked ranges, enableInternet, otherwise refuse.
func (p *Policy) Evaluate(host string, addr netip.Addr, blocked func(netip.Addr) bool) Verdict {
	if host != "" && anyHost(p.DenyHosts, host) {
		return Verdict{Rule: "denied host"}
	}
	if len(p.GateHosts) > 0 && !anyHost(p.GateHosts, host) {
		if _, ok := p.handlerFor(host); !ok {
			return Verdict{Rule: "not in allowed hosts"}
		}
	}
	if k, ok := p.handlerFor(host); ok {
		return Verdict{Allow: true, Handler: p.Handlers[k], Rule: "handler " + k}
	}
	if host != "" && (anyHost(p.AllowHosts, host) || anyHost(p.GateHosts, host)) {
		return Verdict{Allow: true, Rule: "allowed host"}
	}
	if addr.IsValid() {
		for _, c := range p.AllowCIDRs {
			if c.Contains(addr) {
				return Verdict{Allow: true, Rule: "allowed CIDR " + c.String()}
			}
		}
		for _, c := range p.DenyCIDRs {
			if c.Contains(addr) {
				return Verdict{Rule: "denied CIDR " + c.String()}
			}
		}
		if blocked != nil && blocked(addr) {
			return Verdict{Rule: "blocked address " + addr.String()}
		}
	}
	if len(p.GateHosts) > 0 {
		return Verdict{Rule: "not in allowed hosts"}
	}
	if p.AllowInternet {
		return Verdict{Allow: true, Rule: "internet"}
	}
	return Verdict{Rule: "internet access disabled"}
}

// handlerFor finds the handler for host: exact, longest wildcard, then "*".
func (p *Policy) handlerFor(host string) (string, bool) {
	if len(p.Handlers) == 0 || host == "" {
		return "", false
	}
	return best(p.Handlers, host)
}

// RuleFor returns the header transforms for host (exact wins, then the
// longest wildcard).
func (p *Policy) RuleFor(host string) []Rule {
	if k, ok := best(p.Rules, host); ok {
		return p.Rules[k]
	}
	return nil
}

// Secrets returns every header value of the policy's rules.
func (p *Policy) Secrets() []string {
	var out []string
	for _, rs := range p.Rules {
		for _, r := range rs {
			for _, v := range r.Transform.Headers {
				if len(v) >= 4 {
					out = append(out, v)
				}
			}
		}
	}
	return out
}

// Validate checks the policy's shape.
func (p *Policy) Validate() error {
	for _, list := range [][]string{p.AllowHosts, p.GateHosts, p.DenyHosts} {
		for _, h := range list {
			if _, err := NormalizeHostPattern(h); err != nil {
				return err
			}
		}
	}
	for k, rs := range p.Rules {
		if _, err := NormalizeHostPattern(k); err != nil {
			return err
		}
		for _, r := range rs {
			for name, v := range r.Transform.Headers {
				if name == "" || strings.ContainsAny(name, " :\r\n\x00") || strings.ContainsAny(v, "\r\n\x00") {
					return fmt.Errorf("rule for %q: invalid header %q: %w", k, name, errdefs.ErrInvalid)
				}
			}
		}
	}
	for k, u := range p.Handlers {
		if _, err := NormalizeHostPattern(k); err != nil {
			return err
		}
		if !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			return fmt.Errorf("handler for %q: URL %q must be http(s): %w", k, u, errdefs.ErrInvalid)
		}
	}
	return nil
}

// Redacted returns a copy safe to show: header values replaced.
func (p Policy) Redacted() Policy {
	if len(p.Rules) == 0 {
		return p
	}
	rules := map[string][]Rule{}
	for k, rs := range p.Rules {
		for _, r := range rs {
			h := map[string]string{}
			for name := range r.Transform.Headers {
				h[name] = "***"
			}
			rules[k] = append(rules[k], Rule{Transform: Transform{Headers: h}})
		}
	}
	p.Rules = rules
	return p
}

// Config turns a policy back into the sandbox config it is made from
// (PolicyFrom(p.Config()) is p): CIDRs and allowed host globs in allowOut,
// denied CIDRs in denyOut, denied host globs in deniedHosts, the gate in
// allowedHosts. Rule header values are included: redact before showing.
func (p Policy) Config() sandbox.NetworkConfig {
	allow := p.AllowInternet
	cfg := sandbox.NetworkConfig{AllowInternet: &allow}
	for _, c := range p.AllowCIDRs {
		cfg.AllowOut = append(cfg.AllowOut, c.String())
	}
	cfg.AllowOut = append(cfg.AllowOut, p.AllowHosts...)
	for _, c := range p.DenyCIDRs {
		cfg.DenyOut = append(cfg.DenyOut, c.String())
	}
	cfg.AllowedHosts = append(cfg.AllowedHosts, p.GateHosts...)
	cfg.DeniedHosts = append(cfg.DeniedHosts, p.DenyHosts...)
	if len(p.Rules) > 0 {
		cfg.Rules = map[string][]sandbox.NetworkRule{}
		for k, rs := range p.Rules {
			for _, r := range rs {
				h := map[string]string{}
				for name, v := range r.Transform.Headers {
					h[name] = v
				}
				cfg.Rules[k] = append(cfg.Rules[k], sandbox.NetworkRule{Transform: sandbox.NetworkTransform{Headers: h}})
			}
		}
	}
	if len(p.Handlers) > 0 {
		cfg.Handlers = map[string]string{}
		for k, u := range p.Handlers {
			cfg.Handlers[k] = u
		}
	}
	return cfg
}
