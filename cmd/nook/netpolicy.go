package main

import (
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"sort"
	"strings"

	"github.com/spf13/cobra"
)

// netPolicy is the native egress policy as GET/PATCH /v1/sandboxes/{id}/network
// answer it (rule header values are "***").
type netPolicy struct {
	EnableInternet bool              `json:"enableInternet"`
	AllowedHosts   []string          `json:"allowedHosts"`
	DeniedHosts    []string          `json:"deniedHosts"`
	AllowOut       []string          `json:"allowOut"`
	DenyOut        []string          `json:"denyOut"`
	Rules          map[string][]any  `json:"rules"`
	Handlers       map[string]string `json:"handlers"`
}

// withNetworkVerb adds `nook sandbox network` to the sandbox command.
func withNetworkVerb(sb *cobra.Command) *cobra.Command {
	var (
		internet              bool
		allowCIDR, denyCIDR   []string
		allowHost, denyHost   []string
		show, replace, asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "network ID [--internet=true|false] [--allow-out-cidr C]... [--deny-out-cidr C]... [--allow-host GLOB]... [--deny-host GLOB]... [--replace] [--show]",
		Short: "Show or change a running sandbox's egress policy",
		Long: `Show or change a sandbox's egress policy while it runs (the native
GET|PATCH|PUT /v1/sandboxes/{id}/network). A change holds for new connections and requests.

Without flags, or with --show, the policy is printed. Each given flag replaces that one field of
the policy and leaves the others (rules and handlers set through the API included); repeat a
flag for several values, and give it an empty value (--deny-out-cidr '') to empty that list.
With --replace the flags are the whole policy (PUT: every field not given is cleared, the
template's defaults too).

  --internet            enableInternet (E2B allow_internet_access)
  --allow-out-cidr      allowOut: CIDRs or IPs always reachable (they win over deny)
  --deny-out-cidr       denyOut: CIDRs or IPs refused
  --allow-host          allowedHosts: host globs (name or *.name); when set, only these hosts
  --deny-host           deniedHosts: host globs always refused (HTTP Host, TLS SNI, DNS)`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := inheritedClient(cmd)
			if err != nil {
				return err
			}
			path := "/v1/sandboxes/" + url.PathEscape(args[0]) + "/network"
			f := cmd.Flags()
			body := map[string]any{}
			if f.Changed("internet") {
				body["enableInternet"] = internet
			}
			for _, l := range []struct {
				flag, field string
				vals        []string
				cidr        bool
			}{
				{"allow-out-cidr", "allowOut", allowCIDR, true},
				{"deny-out-cidr", "denyOut", denyCIDR, true},
				{"allow-host", "allowedHosts", allowHost, false},
				{"deny-host", "deniedHosts", denyHost, false},
			} {
				if !f.Changed(l.flag) {
					continue
				}
				vals := []string{}
				for _, v := range l.vals {
					v = strings.TrimSpace(v)
					if v == "" {
						continue
					}
					if l.cidr {
						if _, err := netip.ParsePrefix(v); err != nil {
							if _, err := netip.ParseAddr(v); err != nil {
								return fmt.Errorf("--%s %q: want a CIDR such as 10.0.0.0/8 or an IP address", l.flag, v)
							}
						}
					}
					vals = append(vals, v)
				}
				body[l.field] = vals
			}
			var pol netPolicy
			switch {
			case replace:
				if _, err := c.Do(cmd.Context(), http.MethodPut, path, body, nil); err != nil {
					return err
				}
				if _, err := c.Do(cmd.Context(), http.MethodGet, path, nil, &pol); err != nil {
					return err
				}
			case len(body) > 0:
				if _, err := c.Do(cmd.Context(), http.MethodPatch, path, body, &pol); err != nil {
					return err
				}
			default:
				if _, err := c.Do(cmd.Context(), http.MethodGet, path, nil, &pol); err != nil {
					return err
				}
			}
			if len(body) > 0 && !show && !asJSON {
				fmt.Fprintf(os.Stderr, "sandbox %s: network policy updated\n", args[0])
				return nil
			}
			if asJSON {
				return printJSON(pol)
			}
			printPolicy(pol)
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&internet, "internet", true, "internet access (enableInternet)")
	f.StringArrayVar(&allowCIDR, "allow-out-cidr", nil, "CIDR or IP always allowed (repeatable; '' empties the list)")
	f.StringArrayVar(&denyCIDR, "deny-out-cidr", nil, "CIDR or IP refused (repeatable; '' empties the list)")
	f.StringArrayVar(&allowHost, "allow-host", nil, "host glob of the allowed-hosts gate (repeatable; '' empties the list)")
	f.StringArrayVar(&denyHost, "deny-host", nil, "host glob refused (repeatable; '' empties the list)")
	f.BoolVar(&replace, "replace", false, "make the flags the whole policy (fields not given are cleared)")
	f.BoolVar(&show, "show", false, "print the policy (after a change: the new one)")
	f.BoolVar(&asJSON, "json", false, "print the policy as JSON")
	sb.AddCommand(cmd)
	return sb
}

func printPolicy(p netPolicy) {
	list := func(l []string) string {
		if len(l) == 0 {
			return "-"
		}
		return strings.Join(l, " ")
	}
	fmt.Printf("internet:       %v\n", p.EnableInternet)
	fmt.Printf("allow-out-cidr: %s\n", list(p.AllowOut))
	fmt.Printf("deny-out-cidr:  %s\n", list(p.DenyOut))
	fmt.Printf("allow-host:     %s\n", list(p.AllowedHosts))
	fmt.Printf("deny-host:      %s\n", list(p.DeniedHosts))
	var rules []string
	for h, rs := range p.Rules {
		rules = append(rules, fmt.Sprintf("%s (%d)", h, len(rs)))
	}
	sort.Strings(rules)
	fmt.Printf("header rules:   %s\n", list(rules))
	var hs []string
	for h, u := range p.Handlers {
		hs = append(hs, h+" -> "+u)
	}
	sort.Strings(hs)
	fmt.Printf("handlers:       %s\n", list(hs))
}
