package template

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/nookhq/nook/internal/errdefs"
)

// NetworkDefaults is a template's default egress policy (CubeSandbox's
// `tpl create-from-image --allow-internet-access --allow-out-cidr
// --deny-out-cidr`). Every sandbox of the template starts with it; a
// create's allow_internet_access, network.allowOut and network.denyOut
// each replace the template's value of that one field when given.
type NetworkDefaults struct {
	// AllowInternetAccess nil means the platform default (true).
	AllowInternetAccess *bool `json:"allowInternetAccess,omitempty"`
	// AllowOut and DenyOut are CIDRs (a bare IP is a /32); allow wins
	// over deny, as in E2B's allowOut/denyOut.
	AllowOut []string `json:"allowOut,omitempty"`
	DenyOut  []string `json:"denyOut,omitempty"`
}

// IsZero reports whether the defaults leave everything at the platform's.
func (d NetworkDefaults) IsZero() bool {
	return d.AllowInternetAccess == nil && len(d.AllowOut) == 0 && len(d.DenyOut) == 0
}

// NormalizeCIDRs checks a list of --allow-out-cidr / --deny-out-cidr
// values: each an IPv4/IPv6 CIDR or a bare address (made a /32 or /128).
// It returns them masked, in order, without duplicates.
func NormalizeCIDRs(flag string, list []string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, s := range list {
		s = strings.TrimSpace(s)
		var p netip.Prefix
		if pp, err := netip.ParsePrefix(s); err == nil {
			p = pp.Masked()
		} else if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
			p = netip.PrefixFrom(a, a.BitLen())
		} else {
			return nil, fmt.Errorf("%s %q: want a CIDR such as 10.0.0.0/8 or an IP address: %w", flag, s, errdefs.ErrInvalid)
		}
		if !seen[p.String()] {
			seen[p.String()] = true
			out = append(out, p.String())
		}
	}
	return out, nil
}
