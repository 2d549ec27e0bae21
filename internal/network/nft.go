package network

import (
	"encoding/json"
	"fmt"
	"github.com/mdlayher/netlink"
	"net/netip"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The nftables ruleset of one nook instance is one inet table. The desired
// state is always the sandboxes' stored policies, so nothing stale can
// survive a crash: the first apply of a process (and any apply after a
// failed one) rebuilds the table as a whole in one atomic transaction;
// later applies change only the sandboxes that changed (their chain, their
// element in the jump map and in the hostful set), also in one transaction,
// so a create costs the same at 1 or 1000 sandboxes. Layout:
//
//	input       from the bridge: DNS and the egress proxy ports on the
//	            gateway; everything else to the host is refused
//	forward     from the bridge: established flows, then a lookup of the
//	            source address in the map sbjump, whose element jumps into
//	            the sandbox's chain; new flows into the bridge are dropped
//	sb_<id>     the sandbox's CIDR policy (the ranges no sandbox reaches
//	            are the shared chain blocked)
//	prerouting  DNS (any server) to nook's resolver; ports 80/443 of
//	            sandboxes with host rules (the set hostful) to the
//	            transparent proxy
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

const (
	jumpMap    = "sbjump"
	hostfulSet = "hostful"
	blockChain = "blocked"
)

// applied is what the kernel holds per table, as this process last made it
// (nil after a failure: the next apply rebuilds the table).
var applied = struct {
	sync.Mutex
	tables map[string]*appliedTable
}{tables: map[string]*appliedTable{}}

type appliedTable struct {
	base          string            // key of the table-wide settings
	sbs           map[string]string // sandbox id -> key of its address and policy
	jump, hostful *nftables.Set
}

func (st *nftState) baseKey() string {
	return fmt.Sprint(st.bridge, st.cidr, st.gateway, st.dnsPort, st.httpPort, st.tlsPort)
}

func sbKey(sb *sbState) string {
	pol, _ := json.Marshal(sb.Policy)
	return sb.IP.String() + " " + string(pol)
}

// apply makes the instance's table the one st describes: incrementally
// when this process made the table and its settings are unchanged, else by
// rebuilding it.
func (st *nftState) apply() error {
	applied.Lock()
	defer applied.Unlock()
	prev := applied.tables[st.table]
	delete(applied.tables, st.table)
	if prev != nil && prev.base == st.baseKey() {
		next, err := st.applyDiff(prev)
		if err == nil {
			applied.tables[st.table] = next
			return nil
		}
		// Fall back to a rebuild, which is correct whatever the kernel holds.
	}
	next, err := st.rebuild()
	if err != nil {
		return err
	}
	applied.tables[st.table] = next
	return nil
}

func newConn() (*nftables.Conn, error) {
	return nftables.New(nftables.WithSockOptions(bigReceiveBuffer))
}

// applyDiff changes, in one transaction, the sandboxes whose state differs
// from prev.
func (st *nftState) applyDiff(prev *appliedTable) (*appliedTable, error) {
	c, err := newConn()
	if err != nil {
		return nil, err
	}
	tbl := &nftables.Table{Family: nftables.TableFamilyINet, Name: st.table}
	next := &appliedTable{base: prev.base, sbs: map[string]string{}, jump: prev.jump, hostful: prev.hostful}
	want := map[string]*sbState{}
	for _, sb := range st.sandboxes {
		want[sb.ID] = sb
		next.sbs[sb.ID] = sbKey(sb)
	}
	changed := false
	wasHostful := prev.hostfulIDs()
	for id, key := range prev.sbs {
		if sb, ok := want[id]; ok && sbKey(sb) == key {
			continue
		}
		changed = true
		// The old address is the key's first field.
		ip, err := netip.ParseAddr(key[:indexByte(key, ' ')])
		if err != nil {
			return nil, err
		}
		a := ip.As4()
		if err := c.SetDeleteElements(prev.jump, []nftables.SetElement{{Key: a[:]}}); err != nil {
			return nil, err
		}
		// Deleting an absent element would fail the transaction.
		if wasHostful[id] {
			if err := c.SetDeleteElements(prev.hostful, []nftables.SetElement{{Key: a[:]}}); err != nil {
				return nil, err
			}
		}
		ch := &nftables.Chain{Name: sbChain(id), Table: tbl}
		c.FlushChain(ch)
		c.DelChain(ch)
	}
	for id, sb := range want {
		if key, ok := prev.sbs[id]; ok && key == sbKey(sb) {
			continue
		}
		changed = true
		if err := st.addSandbox(c, tbl, next, sb); err != nil {
			return nil, err
		}
	}
	if !changed {
		return next, nil
	}
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	return next, nil
}

func indexByte(s string, b byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == b {
			return i
		}
	}
	return len(s)
}

// hostfulIDs are the sandboxes whose address is in the hostful set.
func (a *appliedTable) hostfulIDs() map[string]bool {
	out := map[string]bool{}
	for id, key := range a.sbs {
		var pol Policy
		if json.Unmarshal([]byte(key[indexByte(key, ' ')+1:]), &pol) == nil && pol.Hostful() {
			out[id] = true
		}
	}
	return out
}

// addSandbox adds sb's chain and its elements in the jump map and (with
// host rules) the hostful set.
func (st *nftState) addSandbox(c *nftables.Conn, tbl *nftables.Table, at *appliedTable, sb *sbState) error {
	ch := c.AddChain(&nftables.Chain{Name: sbChain(sb.ID), Table: tbl})
	st.sandboxRules(c, tbl, ch, sb)
	a := sb.IP.As4()
	if err := c.SetAddElements(at.jump, []nftables.SetElement{{Key: a[:],
		VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: ch.Name}}}); err != nil {
		return err
	}
	if sb.Policy.Hostful() {
		if err := c.SetAddElements(at.hostful, []nftables.SetElement{{Key: a[:]}}); err != nil {
			return err
		}
	}
	return nil
}

// rebuild replaces the instance's table with the one st describes, in one
// transaction.
func (st *nftState) rebuild() (*appliedTable, error) {
	c, err := newConn()
	if err != nil {
		return nil, err
	}
	tbl := &nftables.Table{Family: nftables.TableFamilyINet, Name: st.table}
	c.AddTable(tbl)
	c.DelTable(tbl)
	tbl = c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: st.table})
	at := &appliedTable{base: st.baseKey(), sbs: map[string]string{}}
	at.jump = &nftables.Set{Table: tbl, Name: jumpMap, IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict}
	if err := c.AddSet(at.jump, nil); err != nil {
		return nil, err
	}
	at.hostful = &nftables.Set{Table: tbl, Name: hostfulSet, KeyType: nftables.TypeIPAddr}
	if err := c.AddSet(at.hostful, nil); err != nil {
		return nil, err
	}
	accPolicy := nftables.ChainPolicyAccept
	input := c.AddChain(&nftables.Chain{Name: "input", Table: tbl, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accPolicy})
	forward := c.AddChain(&nftables.Chain{Name: "forward", Table: tbl, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accPolicy})
	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: tbl, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: tbl, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	blocked := c.AddChain(&nftables.Chain{Name: blockChain, Table: tbl})
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

	// blocked: destinations no sandbox reaches unless its chain allowed
	// them before jumping here (the builtin ranges and the sandbox range).
	for _, p := range append(append([]netip.Prefix{}, builtinBlocked...), st.cidr) {
		addReject(c, tbl, blocked, mAddr(false, p))
	}

	// forward
	c.AddRule(&nftables.Rule{Table: tbl, Chain: forward, Exprs: cat(br, mEstablished(), accept)})
	c.AddRule(&nftables.Rule{Table: tbl, Chain: forward, Exprs: cat(mOIF(expr.CmpOpEq, st.bridge), mEstablished(), accept)})
	c.AddRule(&nftables.Rule{Table: tbl, Chain: forward, Exprs: cat(br, mIPv4(), mSaddr(),
		[]expr.Any{&expr.Lookup{SourceRegister: 1, SetName: at.jump.Name, SetID: at.jump.ID, IsDestRegSet: true, DestRegister: 0}})})
	addReject(c, tbl, forward, br)
	c.AddRule(&nftables.Rule{Table: tbl, Chain: forward, Exprs: cat(mOIF(expr.CmpOpEq, st.bridge), drop)})

	// prerouting: every DNS query goes to nook's resolver; hostful
	// sandboxes' web ports go to the transparent proxy.
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		c.AddRule(&nftables.Rule{Table: tbl, Chain: pre, Exprs: cat(br, mIPv4(), mL4(proto), mDport(53), redirect(st.dnsPort))})
	}
	hostful := cat(br, mIPv4(), mSaddr(), []expr.Any{&expr.Lookup{SourceRegister: 1, SetName: at.hostful.Name, SetID: at.hostful.ID}})
	c.AddRule(&nftables.Rule{Table: tbl, Chain: pre, Exprs: cat(hostful, mL4(unix.IPPROTO_TCP), mDport(80), redirect(st.httpPort))})
	c.AddRule(&nftables.Rule{Table: tbl, Chain: pre, Exprs: cat(hostful, mL4(unix.IPPROTO_TCP), mDport(443), redirect(st.tlsPort))})

	// postrouting
	c.AddRule(&nftables.Rule{Table: tbl, Chain: post, Exprs: cat(mIPv4(), mAddr(true, st.cidr),
		mOIF(expr.CmpOpNeq, st.bridge), []expr.Any{&expr.Masq{}})})

	for _, sb := range st.sandboxes {
		if err := st.addSandbox(c, tbl, at, sb); err != nil {
			return nil, err
		}
		at.sbs[sb.ID] = sbKey(sb)
	}
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	return at, nil
}

// mSaddr loads the IPv4 source address into register 1.
func mSaddr() []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}}
}

// sandboxRules is one sandbox's kernel policy for traffic whose host is
// unknown: allowed CIDRs, denied CIDRs, blocked ranges (the shared chain),
// the allowed-hosts gate (only the proxy can check hosts), then internet
// on or off.
func (st *nftState) sandboxRules(c *nftables.Conn, tbl *nftables.Table, ch *nftables.Chain, sb *sbState) {
	for _, p := range sb.Policy.AllowCIDRs {
		if p.Addr().Is4() {
			c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: cat(mAddr(false, p), accept)})
		}
	}
	for _, p := range sb.Policy.DenyCIDRs {
		if p.Addr().Is4() {
			addReject(c, tbl, ch, mAddr(false, p))
		}
	}
	c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: jump(blockChain)})
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
		if serr == nil {
			// and send the whole batch as one message.
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 64<<20)
		}
	}); err != nil {
		return err
	}
	return serr
}

// deleteTable removes the instance's table if it exists.
func deleteTable(name string) error {
	applied.Lock()
	delete(applied.tables, name)
	applied.Unlock()
	c, err := nftables.New()
	if err != nil {
		return err
	}
	tbl := &nftables.Table{Family: nftables.TableFamilyINet, Name: name}
	c.AddTable(tbl)
	c.DelTable(tbl)
	return c.Flush()
}
