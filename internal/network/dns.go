package network

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// resolver answers names for nook itself (the egress proxy) and, filtered,
// for sandboxes: a static hosts file first, then the upstream servers.
type resolver struct {
	hostsFile string
	upstream  []string // host:port
	client    *dns.Client

	mu        sync.Mutex
	hosts     map[string][]netip.Addr
	hostsTime time.Time
}

func newResolver(hostsFile string, upstream []string) (*resolver, error) {
	if len(upstream) == 0 {
		cfg, err := dns.ClientConfigFromFile("/etc/resolv.conf")
		if err == nil {
			for _, s := range cfg.Servers {
				upstream = append(upstream, net.JoinHostPort(s, cfg.Port))
			}
		}
	}
	for i, u := range upstream {
		if _, _, err := net.SplitHostPort(u); err != nil {
			upstream[i] = net.JoinHostPort(u, "53")
		}
	}
	return &resolver{hostsFile: hostsFile, upstream: upstream, client: &dns.Client{Timeout: 3 * time.Second}}, nil
}

// static returns the hosts-file addresses of name (reloading the file when
// it changed).
func (r *resolver) static(name string) []netip.Addr {
	if r.hostsFile == "" {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if st, err := os.Stat(r.hostsFile); err == nil && !st.ModTime().Equal(r.hostsTime) {
		r.hostsTime = st.ModTime()
		r.hosts = map[string][]netip.Addr{}
		if f, err := os.Open(r.hostsFile); err == nil {
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				line, _, _ := strings.Cut(sc.Text(), "#")
				fields := strings.Fields(line)
				if len(fields) < 2 {
					continue
				}
				a, err := netip.ParseAddr(fields[0])
				if err != nil || !a.Is4() {
					continue
				}
				for _, n := range fields[1:] {
					n = strings.ToLower(strings.TrimSuffix(n, "."))
					r.hosts[n] = append(r.hosts[n], a)
				}
			}
			f.Close()
		}
	}
	return r.hosts[name]
}

// exchange forwards a query to the upstream servers.
func (r *resolver) exchange(ctx context.Context, q *dns.Msg) (*dns.Msg, error) {
	if len(r.upstream) == 0 {
		return nil, errors.New("no upstream DNS server")
	}
	var lastErr error
	for _, u := range r.upstream {
		resp, _, err := r.client.ExchangeContext(ctx, q, u)
		if err == nil {
			return resp, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

// lookup returns name's IPv4 addresses.
func (r *resolver) lookup(ctx context.Context, name string) ([]netip.Addr, error) {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	if a, err := netip.ParseAddr(name); err == nil {
		return []netip.Addr{a.Unmap()}, nil
	}
	if as := r.static(name); len(as) > 0 {
		return as, nil
	}
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	q.RecursionDesired = true
	resp, err := r.exchange(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", name, err)
	}
	var out []netip.Addr
	for _, rr := range resp.Answer {
		if a, ok := rr.(*dns.A); ok {
			if ip, ok := netip.AddrFromSlice(a.A.To4()); ok {
				out = append(out, ip)
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("resolve %s: no address", name)
	}
	return out, nil
}

// serveDNS answers a sandbox's query, filtered by its policy: a name the
// host rules refuse is NXDOMAIN; A answers keep only addresses the policy
// allows for that name; AAAA is always empty (sandboxes are IPv4 only).
func (n *Network) serveDNS(w dns.ResponseWriter, req *dns.Msg) {
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.RecursionAvailable = true
	src, _ := netip.ParseAddrPort(w.RemoteAddr().String())
	id, pol, ok := n.policyByIP(src.Addr().Unmap())
	if !ok || len(req.Question) != 1 {
		resp.Rcode = dns.RcodeRefused
		w.WriteMsg(resp)
		return
	}
	q := req.Question[0]
	name := strings.ToLower(strings.TrimSuffix(q.Name, "."))
	v := pol.Evaluate(name, netip.Addr{}, nil)
	if !v.Allow && (v.Rule == "denied host" || v.Rule == "not in allowed hosts") {
		n.log.Warn("egress refused", "sandbox", id, "host", name, "rule", v.Rule, "via", "dns")
		resp.Rcode = dns.RcodeNameError
		w.WriteMsg(resp)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	switch q.Qtype {
	case dns.TypeAAAA:
	case dns.TypeA:
		addrs, err := n.resolver.lookup(ctx, name)
		if err != nil && v.Handler == "" {
			resp.Rcode = dns.RcodeNameError
			break
		}
		for _, a := range addrs {
			if !pol.Evaluate(name, a, n.blocked).Allow {
				continue
			}
			resp.Answer = append(resp.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30},
				A:   net.IP(a.AsSlice()),
			})
		}
		if len(resp.Answer) == 0 && v.Handler != "" {
			// A handler answers for this host even if it has no address:
			// send the sandbox to the gateway, where the proxy is.
			resp.Answer = append(resp.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30},
				A:   net.IP(n.gw.AsSlice()),
			})
		}
	default:
		up, err := n.resolver.exchange(ctx, req)
		if err != nil {
			resp.Rcode = dns.RcodeServerFailure
			break
		}
		up.Id = req.Id
		w.WriteMsg(up)
		return
	}
	w.WriteMsg(resp)
}
