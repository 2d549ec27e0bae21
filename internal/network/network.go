// Package network gives each sandbox its network: its own network
// namespace with a veth into nook's bridge (NAT to the outside), an egress
// policy enforced in the kernel with nftables, nook's own DNS resolver for
// the sandbox (answers filtered by host rules), and a transparent proxy for
// ports 80/443 of sandboxes with host rules (HTTP Host, TLS SNI, header
// injection with HTTPS interception by a nook-generated CA).
//
// Everything of a nook instance is named after a tag derived from its data
// dir (bridge "nook<tag>", nftables table "nook_<tag>"), so several nook
// instances can run on one host. Per-sandbox state is stored under
// DATA/network/sandboxes, and the kernel ruleset is always rebuilt from it,
// so a restart after a kill re-adopts or cleans everything.
package network

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/runtime"
	"github.com/nookhq/nook/internal/sandbox"
)

// Options configure a Network.
type Options struct {
	DataDir string
	// CIDR is the sandboxes' IPv4 range ("" picks a free /16 of 10.200.0.0-
	// 10.249.0.0). nook refuses a range that overlaps the host's networks.
	CIDR string
	// HostsFile is an optional /etc/hosts-style file the resolver answers
	// from before asking upstream.
	HostsFile string
	// UpstreamDNS are host:port servers (default: /etc/resolv.conf's).
	UpstreamDNS []string
	// UpstreamCAFile adds roots the proxy trusts for intercepted HTTPS
	// upstreams, beside the system roots.
	UpstreamCAFile string
	// HTTPPort and TLSPort are the transparent proxy's ports on the gateway.
	HTTPPort, TLSPort uint16
	Log               *slog.Logger
}

// Network implements sandbox.Network.
type Network struct {
	opt    Options
	log    *slog.Logger
	dir    string
	nsDir  string
	bridge string
	table  string
	cidr   netip.Prefix
	gw     netip.Addr

	ca       *ca
	resolver *resolver
	upstream *http.Transport // template for per-sandbox transports

	mu   sync.RWMutex
	sbs  map[string]*sbState // guarded by mu
	byIP map[netip.Addr]*sbState
	tr   map[string]*http.Transport

	servers []interface{ Shutdown(context.Context) error }
	lns     []net.Listener
	spares  *spareNamespaces // filled from Prune on

	hostAddrsMu   sync.Mutex
	hostAddrs     map[netip.Addr]bool
	hostAddrsTime time.Time
}

var _ sandbox.Network = (*Network)(nil)
var _ sandbox.NetworkUpdater = (*Network)(nil)

// sbState is one sandbox's stored network state.
type sbState struct {
	ID     string     `json:"id"`
	IP     netip.Addr `json:"ip"`
	Policy Policy     `json:"policy"`
}

type instanceState struct {
	CIDR string `json:"cidr"`
}

// Tag is the short name of the nook instance owning dataDir.
func Tag(dataDir string) string {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		abs = dataDir
	}
	sum := sha256.Sum256([]byte(abs))
	return hex.EncodeToString(sum[:3])
}

// BridgeName and TableName are the kernel objects of dataDir's instance.
func BridgeName(dataDir string) string { return "nook" + Tag(dataDir) }
func TableName(dataDir string) string  { return "nook_" + Tag(dataDir) }

func vethName(id string) string {
	if len(id) > 12 {
		id = id[len(id)-12:]
	}
	return "nk" + id
}

// New sets up the instance's bridge, CA, resolver, DNS server and proxy,
// loads the stored sandboxes' state and rebuilds the ruleset. Call Prune
// once the sandbox manager has recovered, with the ids still alive.
func New(ctx context.Context, opt Options) (*Network, error) {
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	if opt.HTTPPort == 0 {
		opt.HTTPPort = 15080
	}
	if opt.TLSPort == 0 {
		opt.TLSPort = 15443
	}
	n := &Network{
		opt: opt, log: opt.Log,
		dir:    filepath.Join(opt.DataDir, "network"),
		bridge: BridgeName(opt.DataDir), table: TableName(opt.DataDir),
		sbs: map[string]*sbState{}, byIP: map[netip.Addr]*sbState{}, tr: map[string]*http.Transport{},
	}
	n.nsDir = filepath.Join(n.dir, "netns")
	n.spares = &spareNamespaces{dir: n.nsDir, size: spareCount, log: n.log}
	for _, d := range []string{n.dir, n.nsDir, filepath.Join(n.dir, "sandboxes")} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, err
		}
	}
	if err := n.chooseCIDR(); err != nil {
		return nil, err
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return nil, fmt.Errorf("enable IPv4 forwarding: %w", err)
	}
	bits := n.cidr.Bits()
	if _, err := ensureBridge(n.bridge, netip.PrefixFrom(n.gw, bits)); err != nil {
		return nil, err
	}
	var err error
	if n.ca, err = loadOrCreateCA(n.dir); err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	if err := n.writeSandboxFiles(); err != nil {
		return nil, err
	}
	if n.resolver, err = newResolver(opt.HostsFile, opt.UpstreamDNS); err != nil {
		return nil, err
	}
	if err := n.initUpstream(); err != nil {
		return nil, err
	}
	if err := n.loadStates(); err != nil {
		return nil, err
	}
	if err := n.applyLocked(); err != nil {
		return nil, err
	}
	if err := n.serve(); err != nil {
		n.Close()
		return nil, err
	}
	n.log.Info("sandbox network ready", "bridge", n.bridge, "cidr", n.cidr, "gateway", n.gw, "sandboxes", len(n.sbs))
	return n, nil
}

// chooseCIDR settles the instance's range: the flag, else the stored one,
// else the first free /16 of 10.200-10.249.
func (n *Network) chooseCIDR() error {
	statePath := filepath.Join(n.dir, "instance.json")
	var st instanceState
	if data, err := os.ReadFile(statePath); err == nil {
		json.Unmarshal(data, &st)
	}
	try := func(s string) (netip.Prefix, string, error) {
		p, err := netip.ParsePrefix(s)
		if err != nil || !p.Addr().Is4() || p.Bits() < 8 || p.Bits() > 28 {
			return netip.Prefix{}, "", fmt.Errorf("network range %q: want an IPv4 CIDR from /8 to /28: %w", s, errdefs.ErrInvalid)
		}
		p = p.Masked()
		what, err := hostOverlap(p, n.bridge)
		return p, what, err
	}
	var chosen netip.Prefix
	switch {
	case n.opt.CIDR != "":
		p, what, err := try(n.opt.CIDR)
		if err != nil {
			return err
		}
		if what != "" {
			return fmt.Errorf("network range %s overlaps the host's %s; choose another with --network-cidr", p, what)
		}
		chosen = p
	default:
		cands := []string{}
		if st.CIDR != "" {
			cands = append(cands, st.CIDR)
		}
		for i := 200; i < 250; i++ {
			cands = append(cands, fmt.Sprintf("10.%d.0.0/16", i))
		}
		for _, c := range cands {
			if p, what, err := try(c); err == nil && what == "" {
				chosen = p
				break
			}
		}
		if !chosen.IsValid() {
			return errors.New("no free network range in 10.200.0.0-10.249.255.255; set one with --network-cidr")
		}
	}
	if st.CIDR != "" && st.CIDR != chosen.String() {
		// The range changed: sandboxes of the old one cannot keep theirs.
		n.log.Warn("network range changed; sandboxes of the old range lose their network", "old", st.CIDR, "new", chosen)
	}
	n.cidr = chosen
	n.gw = chosen.Addr().Next()
	data, _ := json.Marshal(instanceState{CIDR: chosen.String()})
	return os.WriteFile(statePath, data, 0o600)
}

// writeSandboxFiles writes what is mounted into every sandbox: resolv.conf
// (nook's resolver on the gateway), the CA and a CA bundle (the host's
// roots plus nook's CA).
func (n *Network) writeSandboxFiles() error {
	resolv := fmt.Sprintf("# nook: the sandbox's resolver\nnameserver %s\noptions edns0\n", n.gw)
	if err := os.WriteFile(filepath.Join(n.dir, "resolv.conf"), []byte(resolv), 0o644); err != nil {
		return err
	}
	bundle, _ := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	if len(bundle) > 0 && bundle[len(bundle)-1] != '\n' {
		bundle = append(bundle, '\n')
	}
	bundle = append(bundle, n.ca.certPEM...)
	return os.WriteFile(filepath.Join(n.dir, "ca-bundle.crt"), bundle, 0o644)
}

// Paths of nook's CA inside sandboxes.
const (
	SandboxCABundle = "/etc/ssl/certs/ca-certificates.crt"
	SandboxCA       = "/etc/ssl/certs/nook-egress-ca.pem"
)

func (n *Network) loadStates() error {
	dir := filepath.Join(n.dir, "sandboxes")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		var st sbState
		if err == nil {
			err = json.Unmarshal(data, &st)
		}
		if err != nil || !n.cidr.Contains(st.IP) {
			n.log.Warn("dropping unusable sandbox network state", "file", e.Name(), "err", err)
			id := strings.TrimSuffix(e.Name(), ".json")
			n.teardownKernel(id)
			os.Remove(filepath.Join(dir, e.Name()))
			continue
		}
		n.sbs[st.ID] = &st
		n.byIP[st.IP] = &st
	}
	return nil
}

func (n *Network) statePath(id string) string {
	return filepath.Join(n.dir, "sandboxes", id+".json")
}

func (n *Network) saveState(st *sbState) error {
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	tmp := n.statePath(st.ID) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, n.statePath(st.ID))
}

// applyLocked rebuilds the kernel ruleset. Preconditions: n.mu held (or
// not yet shared).
func (n *Network) applyLocked() error {
	st := &nftState{table: n.table, bridge: n.bridge, cidr: n.cidr, gateway: n.gw,
		dnsPort: 53, httpPort: n.opt.HTTPPort, tlsPort: n.opt.TLSPort}
	for _, sb := range n.sbs {
		st.sandboxes = append(st.sandboxes, sb)
	}
	return st.apply()
}

// allocLocked returns a free address. Preconditions: n.mu held.
func (n *Network) allocLocked() (netip.Addr, error) {
	for a := n.gw.Next(); n.cidr.Contains(a); a = a.Next() {
		if !n.cidr.Contains(a.Next()) {
			break // the broadcast address
		}
		if _, used := n.byIP[a]; !used {
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("network range %s is full: %w", n.cidr, errdefs.ErrUnavailable)
}

// PolicyFrom turns a sandbox's network config into its policy.
func PolicyFrom(cfg sandbox.NetworkConfig) (Policy, error) {
	p := DefaultPolicy()
	if cfg.AllowInternet != nil {
		p.AllowInternet = *cfg.AllowInternet
	}
	var err error
	if p.AllowCIDRs, p.AllowHosts, err = ParseTargets(cfg.AllowOut); err != nil {
		return Policy{}, err
	}
	if p.DenyCIDRs, p.DenyHosts, err = ParseTargets(cfg.DenyOut); err != nil {
		return Policy{}, err
	}
	for _, h := range cfg.AllowedHosts {
		g, err := NormalizeHostPattern(h)
		if err != nil {
			return Policy{}, err
		}
		p.GateHosts = append(p.GateHosts, g)
	}
	for _, h := range cfg.DeniedHosts {
		g, err := NormalizeHostPattern(h)
		if err != nil {
			return Policy{}, err
		}
		p.DenyHosts = append(p.DenyHosts, g)
	}
	if len(cfg.Rules) > 0 {
		p.Rules = map[string][]Rule{}
		for k, rs := range cfg.Rules {
			g, err := NormalizeHostPattern(k)
			if err != nil {
				return Policy{}, err
			}
			for _, r := range rs {
				p.Rules[g] = append(p.Rules[g], Rule{Transform: Transform{Headers: r.Transform.Headers}})
			}
		}
	}
	if len(cfg.Handlers) > 0 {
		p.Handlers = map[string]string{}
		for k, u := range cfg.Handlers {
			g, err := NormalizeHostPattern(k)
			if err != nil {
				return Policy{}, err
			}
			p.Handlers[g] = u
		}
	}
	if err := p.Validate(); err != nil {
		return Policy{}, err
	}
	return p, nil
}

// Setup makes sandbox id's namespace, veth, address and rules.
func (n *Network) Setup(ctx context.Context, id string, cfg sandbox.NetworkConfig) (_ sandbox.NetworkSetup, err error) {
	pol, err := PolicyFrom(cfg)
	if err != nil {
		return sandbox.NetworkSetup{}, err
	}
	nsPath := filepath.Join(n.nsDir, id)
	// The address and state are taken under the lock; the namespaces and
	// the veth (most of the work) are made outside it, so that concurrent
	// creates do not queue behind each other; the rules are applied under
	// it again, before the sandbox starts.
	n.mu.Lock()
	if _, ok := n.sbs[id]; ok {
		n.mu.Unlock()
		return sandbox.NetworkSetup{}, fmt.Errorf("sandbox %s already has a network: %w", id, errdefs.ErrConflict)
	}
	ip, err := n.allocLocked()
	if err != nil {
		n.mu.Unlock()
		return sandbox.NetworkSetup{}, err
	}
	st := &sbState{ID: id, IP: ip, Policy: pol}
	// Record first: a crash from here on leaves a state file that the next
	// start's Prune cleans.
	if err := n.saveState(st); err != nil {
		n.mu.Unlock()
		return sandbox.NetworkSetup{}, err
	}
	n.sbs[id], n.byIP[ip] = st, st
	n.mu.Unlock()
	defer func() {
		if err != nil {
			n.mu.Lock()
			defer n.mu.Unlock()
			delete(n.sbs, id)
			delete(n.byIP, ip)
			n.teardownKernel(id)
			os.Remove(n.statePath(id))
			n.applyLocked()
		}
	}()
	t0 := time.Now()
	if !n.spares.take(nsPath) {
		if err := newNetns(nsPath); err != nil {
			return sandbox.NetworkSetup{}, fmt.Errorf("network namespace: %w", err)
		}
	}
	tNS := time.Now()
	br, err := netlink.LinkByName(n.bridge)
	if err != nil {
		return sandbox.NetworkSetup{}, fmt.Errorf("bridge %s: %w", n.bridge, err)
	}
	if err := plumb(nsPath, vethName(id), br, netip.PrefixFrom(ip, n.cidr.Bits()), netip.PrefixFrom(n.gw, n.cidr.Bits())); err != nil {
		return sandbox.NetworkSetup{}, err
	}
	tVeth := time.Now()
	n.mu.Lock()
	err = n.applyLocked()
	n.mu.Unlock()
	if err != nil {
		return sandbox.NetworkSetup{}, err
	}
	n.log.Debug("sandbox network made", "id", id, "namespaces", tNS.Sub(t0), "veth", tVeth.Sub(tNS), "rules", time.Since(tVeth))
	return sandbox.NetworkSetup{
		NetNSPath:  nsPath,
		UserNSPath: userNSPath(nsPath),
		Mounts: []runtime.Mount{
			{Source: filepath.Join(n.dir, "resolv.conf"), Target: "/etc/resolv.conf", ReadOnly: true},
			{Source: filepath.Join(n.dir, "ca-bundle.crt"), Target: SandboxCABundle, ReadOnly: true},
			{Source: filepath.Join(n.dir, "ca.pem"), Target: SandboxCA, ReadOnly: true},
		},
		Env: []string{
			"SSL_CERT_FILE=" + SandboxCABundle,
			"REQUESTS_CA_BUNDLE=" + SandboxCABundle,
			"CURL_CA_BUNDLE=" + SandboxCABundle,
			"NODE_EXTRA_CA_CERTS=" + SandboxCA,
		},
	}, nil
}

// teardownKernel removes id's veth and namespace (not its rules).
func (n *Network) teardownKernel(id string) error {
	return errors.Join(delLink(vethName(id)), removeNetns(filepath.Join(n.nsDir, id)))
}

// Teardown removes everything of id; unknown ids are fine.
func (n *Network) Teardown(ctx context.Context, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.teardownLocked(id)
}

func (n *Network) teardownLocked(id string) error {
	err := n.teardownKernel(id)
	if st, ok := n.sbs[id]; ok {
		delete(n.sbs, id)
		delete(n.byIP, st.IP)
		err = errors.Join(err, n.applyLocked())
	}
	if tr, ok := n.tr[id]; ok {
		tr.CloseIdleConnections()
		delete(n.tr, id)
	}
	if rerr := os.Remove(n.statePath(id)); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	return err
}

// Update replaces id's policy; it holds for new connections and requests.
func (n *Network) Update(ctx context.Context, id string, cfg sandbox.NetworkConfig) error {
	pol, err := PolicyFrom(cfg)
	if err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	st, ok := n.sbs[id]
	if !ok {
		return fmt.Errorf("sandbox %s has no network: %w", id, errdefs.ErrNotFound)
	}
	old := st.Policy
	st.Policy = pol
	if err := n.applyLocked(); err != nil {
		st.Policy = old
		return err
	}
	if tr, ok := n.tr[id]; ok {
		tr.CloseIdleConnections()
		delete(n.tr, id)
	}
	n.log.Info("sandbox network policy updated", "id", id, "internet", pol.AllowInternet,
		"allowCIDRs", len(pol.AllowCIDRs), "denyCIDRs", len(pol.DenyCIDRs), "hostRules", pol.Hostful())
	return n.saveState(st)
}

// Check reports whether cfg is a valid policy, without applying it.
func (n *Network) Check(cfg sandbox.NetworkConfig) error {
	_, err := PolicyFrom(cfg)
	return err
}

// Current returns id's current policy as a config, secrets included.
func (n *Network) Current(id string) (sandbox.NetworkConfig, bool) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	st, ok := n.sbs[id]
	if !ok {
		return sandbox.NetworkConfig{}, false
	}
	return st.Policy.Config(), true
}

// Policy returns id's current policy with secrets redacted.
func (n *Network) Policy(id string) (Policy, bool) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	st, ok := n.sbs[id]
	if !ok {
		return Policy{}, false
	}
	return st.Policy.Redacted(), true
}

// Prune removes the network of every sandbox not in keep: state, veths on
// the bridge and pinned namespaces that an earlier, killed nook left.
func (n *Network) Prune(keep []string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	alive := map[string]bool{}
	veths := map[string]bool{}
	for _, id := range keep {
		alive[id] = true
		veths[vethName(id)] = true
	}
	var errs []error
	for id := range n.sbs {
		if !alive[id] {
			n.log.Warn("removing the network of a sandbox that is gone", "id", id)
			errs = append(errs, n.teardownLocked(id))
		}
	}
	for _, dir := range []string{n.nsDir, filepath.Join(n.dir, "userns")} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if !alive[e.Name()] {
				errs = append(errs, removeNetns(filepath.Join(n.nsDir, e.Name())))
			}
		}
	}
	if br, err := netlink.LinkByName(n.bridge); err == nil {
		links, _ := netlink.LinkList()
		for _, l := range links {
			if l.Attrs().MasterIndex == br.Attrs().Index && !veths[l.Attrs().Name] {
				n.log.Warn("removing a leftover veth", "name", l.Attrs().Name)
				errs = append(errs, netlink.LinkDel(l))
			}
		}
	}
	errs = append(errs, n.applyLocked())
	n.spares.refill(0) // after the sweep above, which removes any spare
	return errors.Join(errs...)
}

// spareCount is how many network namespaces are kept made ahead of time.
const spareCount = 4

// Close stops the resolver and the proxy. Sandboxes' kernel state stays:
// sandboxes keep running and are re-adopted by the next start.
func (n *Network) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, s := range n.servers {
		s.Shutdown(ctx)
	}
	for _, l := range n.lns {
		l.Close()
	}
	spareErr := n.spares.close()
	n.mu.Lock()
	idle := len(n.sbs) == 0
	n.mu.Unlock()
	if idle {
		// Nothing runs: leave no bridge or ruleset behind either.
		return errors.Join(spareErr, Remove(n.opt.DataDir))
	}
	return spareErr
}

// Remove deletes everything of dataDir's instance from the kernel: the
// bridge, the ruleset and pinned namespaces (for tests and uninstall; the
// sandboxes must be gone).
func Remove(dataDir string) error {
	var errs []error
	nsDir := filepath.Join(dataDir, "network", "netns")
	for _, dir := range []string{nsDir, filepath.Join(dataDir, "network", "userns")} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			errs = append(errs, delLink(vethName(e.Name())), removeNetns(filepath.Join(nsDir, e.Name())))
		}
	}
	errs = append(errs, delLink(BridgeName(dataDir)))
	if err := deleteTable(TableName(dataDir)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// policyByIP finds the sandbox that owns a source address.
func (n *Network) policyByIP(a netip.Addr) (string, Policy, bool) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	st, ok := n.byIP[a]
	if !ok {
		return "", Policy{}, false
	}
	return st.ID, st.Policy, true
}

// blocked reports addresses a sandbox never reaches without an explicit
// allow: loopback, link-local/metadata, multicast, the sandboxes' range and
// the host's own addresses.
func (n *Network) blocked(a netip.Addr) bool {
	a = a.Unmap()
	if !a.Is4() || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsMulticast() || a.IsUnspecified() || n.cidr.Contains(a) {
		return true
	}
	for _, p := range builtinBlocked {
		if p.Contains(a) {
			return true
		}
	}
	n.hostAddrsMu.Lock()
	defer n.hostAddrsMu.Unlock()
	if time.Since(n.hostAddrsTime) > 5*time.Second {
		n.hostAddrs = map[netip.Addr]bool{}
		if addrs, err := net.InterfaceAddrs(); err == nil {
			for _, ad := range addrs {
				if ipn, ok := ad.(*net.IPNet); ok {
					if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
						n.hostAddrs[ip.Unmap()] = true
					}
				}
			}
		}
		n.hostAddrsTime = time.Now()
	}
	return n.hostAddrs[a]
}

// serve starts the DNS server and the proxy on the gateway address.
func (n *Network) serve() error {
	dnsAddr := net.JoinHostPort(n.gw.String(), "53")
	h := dns.HandlerFunc(n.serveDNS)
	for _, proto := range []string{"udp", "tcp"} {
		s := &dns.Server{Addr: dnsAddr, Net: proto, Handler: h}
		started := make(chan error, 1)
		s.NotifyStartedFunc = func() { started <- nil }
		go func() {
			if err := s.ListenAndServe(); err != nil {
				select {
				case started <- err:
				default:
				}
			}
		}()
		if err := <-started; err != nil {
			return fmt.Errorf("DNS on %s/%s: %w", dnsAddr, proto, err)
		}
		n.servers = append(n.servers, dnsShutdown{s})
	}
	return n.serveProxy()
}

type dnsShutdown struct{ s *dns.Server }

func (d dnsShutdown) Shutdown(ctx context.Context) error { return d.s.ShutdownContext(ctx) }
