package network

import (
	"fmt"
	"github.com/mdlayher/netlink"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The nftables ruleset of one nook instance is one inet table, rebuilt as a
// whole in one atomic transaction on every change (create, update,
// teardown): the desired state is always the sandboxes' stored policies, so
// nothing stale can survive a crash. Layout:
//
//	input       from the bridge: DNS and the egress proxy ports on the
//	            gateway; everything else to the host is refused
//	forward     from the bridge: established flows, then one jump per
//	            sandbox (by its address) into its chain; new flows into
//	            the bridge are dropped
//	sb_<id>     the sandbox's CIDR policy
//	prerouting  DNS (any server) to nook's resolver; ports 80/443 of
//	            sandboxes with host rules to the transparent proxy
//	postrouting masquerade of the sandbox range leaving by another link

type nftState struct {
	table     string
	bridge    string
	cidr      netip.Prefix
	gateway   netip.Addr
	dnsPort   uint16
	httpPort  uint16
	tlsPort   uint16
	sandboxes []*sbState
}

func ifname(n string) []byte {
	b := make([]byte, 16)
	copy(b, n)
	return b
}

func mIIF(name string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(name)},
	}
}

func mOIF(op expr.CmpOp, name string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: ifname(name)},
	}
}

func mIPv4() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

func mL4(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

func mDport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

// mAddr matches the IPv4 source (src) or destination against prefix p.
func mAddr(src bool, p netip.Prefix) []expr.Any {
	off := uint32(16)
	if src {
		off = 12
	}
	a := p.Masked().Addr().As4()
	mask := netipMask(p.Bits())
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:]},
	}
}

func netipMask(bits int) []byte {
	m := uint32(0)
	if bits > 0 {
		m = ^uint32(0) << (32 - bits)
	}
	return binaryutil.BigEndian.PutUint32(m)
}

func mEstablished() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

var (
	accept = []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}
	drop   = []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}
)

func jump(chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}
}

func redirect(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.Redir{RegisterProtoMin: 1, Flags: expr.NF_NAT_RANGE_PROTO_SPECIFIED},
	}
}

// addReject adds rules that refuse what match matches quickly: a TCP reset
// for TCP, an ICMP administratively-prohibited for the rest.
func addReject(c *nftables.Conn, t *nftables.Table, ch *nftables.Chain, match []expr.Any) {
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: cat(match, mL4(unix.IPPROTO_TCP),
		[]expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}})})
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: cat(match,
		[]expr.Any{&expr.Reject{Type: 2 /* NFT_REJECT_ICMPX_UNREACH */, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}})})
}

// builtinBlocked are destinations a sandbox never reaches unless a rule
// explicitly allows them (its own range is added at run time).
var builtinBlocked = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"), // link-local, cloud metadata
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
}

func sbChain(id string) string { return "sb_" + id }

// apply replaces the instance's table with the one st describes.
func (st *nftState) apply() error {
	c, err := nftables.New(nftables.WithSockOptions(bigReceiveBuffer))
	if err != nil {
		return err
	}
	tbl := &nftables.Table{Family: nftables.TableFamilyINet, Name: st.table}
	c.AddTable(tbl)
	c.DelTable(tbl)
	tbl = c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: st.table})
	accPolicy := nftables.ChainPolicyAccept
	input := c.AddChain(&nftables.Chain{Name: "input", Table: tbl, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accPolicy})
	forward := c.AddChain(&nftables.Chain{Name: "forward", Table: tbl, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accPolicy})
	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: tbl, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: tbl, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	br := mIIF(st.bridge)
	gw := netip.PrefixFrom(st.gateway, 32)

	// input: only DNS and the proxy, on the gateway address.
	c.AddRule(&nftables.Rule{Table: tbl, Chain: input, Exprs: cat(br, mEstablished(), accept)})
	for _, pr := range []struct {
		proto byte
		port  uint16
	}{{unix.IPPROTO_UDP, st.dnsPort}, {unix.IPPROTO_TCP, st.dnsPort}, {unix.IPPROTO_TCP, st.httpPort}, {unix.IPPROTO_TCP, st.tlsPort}} {
		c.AddRule(&nftables.Rule{Table: tbl, Chain: input, Exprs: cat(br, mIPv4(), mAddr(false, gw), mL4(pr.proto), mDport(pr.port), accept)})
	}
	addReject(c, tbl, input, br)

	// forward
	c.AddRule(&nftables.Rule{Table: tbl, Chain: forward, Exprs: cat(br, mEstablished(), accept)})
	c.AddRule(&nftables.Rule{Table: tbl, Chain: forward, Exprs: cat(mOIF(expr.CmpOpEq, st.bridge), mEstablished(), accept)})
	for _, sb := range st.sandboxes {
		ch := c.AddChain(&nftables.Chain{Name: sbChain(sb.ID), Table: tbl})
		st.sandboxRules(c, tbl, ch, sb)
		c.AddRule(&nftables.Rule{Table: tbl, Chain: forward, UserData: []byte(sb.ID),
			Exprs: cat(br, mIPv4(), mAddr(true, netip.PrefixFrom(sb.IP, 32)), jump(ch.Name))})
	}
	addReject(c, tbl, forward, br)
	c.AddRule(&nftables.Rule{Table: tbl, Chain: forward, Exprs: cat(mOIF(expr.CmpOpEq, st.bridge), drop)})

	// prerouting: every DNS query goes to nook's resolver; hostful
	// sandboxes' web ports go to the transparent proxy.
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		c.AddRule(&nftables.Rule{Table: tbl, Chain: pre, Exprs: cat(br, mIPv4(), mL4(proto), mDport(53), redirect(st.dnsPort))})
	}
	for _, sb := range st.sandboxes {
		if !sb.Policy.Hostful() {
			continue
		}
		src := mAddr(true, netip.PrefixFrom(sb.IP, 32))
		c.AddRule(&nftables.Rule{Table: tbl, Chain: pre, Exprs: cat(br, mIPv4(), src, mL4(unix.IPPROTO_TCP), mDport(80), redirect(st.httpPort))})
		c.AddRule(&nftables.Rule{Table: tbl, Chain: pre, Exprs: cat(br, mIPv4(), src, mL4(unix.IPPROTO_TCP), mDport(443), redirect(st.tlsPort))})
	}

	// postrouting
	c.AddRule(&nftables.Rule{Table: tbl, Chain: post, Exprs: cat(mIPv4(), mAddr(true, st.cidr),
		mOIF(expr.CmpOpNeq, st.bridge), []expr.Any{&expr.Masq{}})})

	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	return nil
}

// sandboxRules is one sandbox's kernel policy for traffic whose host is
// unknown: allowed CIDRs, denied CIDRs, blocked ranges, the allowed-hosts
// gate (only the proxy can check hosts), then internet on or off.
func (st *nftState) sandboxRules(c *nftables.Conn, tbl *nftables.Table, ch *nftables.Chain, sb *sbState) {
	for _, p := range sb.Policy.AllowCIDRs {
		if p.Addr().Is4() {
			c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: cat(mAddr(false, p), accept)})
		}
	}
	blocked := append(append([]netip.Prefix{}, sb.Policy.DenyCIDRs...), builtinBlocked...)
	blocked = append(blocked, st.cidr)
	for _, p := range blocked {
		if p.Addr().Is4() {
			addReject(c, tbl, ch, mAddr(false, p))
		}
	}
	if len(sb.Policy.GateHosts) == 0 && sb.Policy.AllowInternet {
		c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: accept})
		return
	}
	addReject(c, tbl, ch, nil)
}

// bigReceiveBuffer lets one flush rebuild a table of many sandboxes: the
// kernel acknowledges every message of the batch, and the default netlink
// receive buffer overflows (ENOBUFS) at a few hundred rules.
func bigReceiveBuffer(c *netlink.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 32<<20)
	}); err != nil {
		return err
	}
	return serr
}

// deleteTable removes the instance's table if it exists.
func deleteTable(name string) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	tbl := &nftables.Table{Family: nftables.TableFamilyINet, Name: name}
	c.AddTable(tbl)
	c.DelTable(tbl)
	return c.Flush()
}
