package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/spf13/pflag"

	"github.com/nookhq/nook/internal/network"
	"github.com/nookhq/nook/internal/sandbox"
)

// netFlags are nook serve's sandbox-networking flags.
type netFlags struct {
	enabled                         bool
	cidr, hostsFile, upstreamCAFile string
	dns                             []string
}

func (n *netFlags) register(f *pflag.FlagSet) {
	f.BoolVar(&n.enabled, "network", true, "give sandboxes internet access through nook's bridge, NAT and egress policy; false: every sandbox is loopback only")
	f.StringVar(&n.cidr, "network-cidr", "", "IPv4 range for sandbox addresses (default: a free /16 of 10.200.0.0-10.249.0.0); refused if it overlaps the host's networks")
	f.StringVar(&n.hostsFile, "network-hosts-file", "", "hosts file (/etc/hosts format) the sandboxes' resolver answers from before asking upstream")
	f.StringSliceVar(&n.dns, "network-dns", nil, "upstream DNS servers (host[:port]) of the sandboxes' resolver (default: those of /etc/resolv.conf)")
	f.StringVar(&n.upstreamCAFile, "network-upstream-ca", "", "extra CA certificates (PEM) the egress proxy trusts for intercepted HTTPS upstreams")
}

// start sets up sandbox networking (nil when disabled).
func (n *netFlags) start(ctx context.Context, dataDir string, log *slog.Logger) (*network.Network, error) {
	if !n.enabled {
		return nil, nil
	}
	netw, err := network.New(ctx, network.Options{
		DataDir: dataDir, CIDR: n.cidr, HostsFile: n.hostsFile, UpstreamDNS: n.dns,
		UpstreamCAFile: n.upstreamCAFile, Log: log,
	})
	if err != nil {
		return nil, fmt.Errorf("sandbox network: %w", err)
	}
	return netw, nil
}

// sandboxNetwork avoids a typed nil in the interface.
func sandboxNetwork(n *network.Network) sandbox.Network {
	if n == nil {
		return nil
	}
	return n
}

// pruneNetwork removes the networks of sandboxes that did not survive a
// restart (kill of nook serve included).
func pruneNetwork(n *network.Network, mgr *sandbox.Manager) error {
	if n == nil {
		return nil
	}
	var ids []string
	for _, sb := range mgr.List() {
		ids = append(ids, sb.ID)
	}
	return n.Prune(ids)
}
