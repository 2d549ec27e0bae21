package network

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/runtime"
)

// ensureBridge makes the bridge with the gateway address (and only it).
func ensureBridge(name string, gw netip.Prefix) (netlink.Link, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return nil, err
		}
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
		if err := netlink.LinkAdd(br); err != nil {
			return nil, fmt.Errorf("create bridge %s: %w", name, err)
		}
		if l, err = netlink.LinkByName(name); err != nil {
			return nil, err
		}
	}
	addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return nil, err
	}
	have := false
	for _, a := range addrs {
		p, _ := netip.AddrFromSlice(a.IP.To4())
		ones, _ := a.Mask.Size()
		if p == gw.Addr() && ones == gw.Bits() {
			have = true
			continue
		}
		netlink.AddrDel(l, &a)
	}
	if !have {
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipnet(gw)}); err != nil {
			return nil, fmt.Errorf("address bridge %s: %w", name, err)
		}
	}
	// No IPv6 on the bridge: sandboxes are IPv4 only.
	os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", []byte("1"), 0o644)
	if err := netlink.LinkSetUp(l); err != nil {
		return nil, err
	}
	return l, nil
}

func ipnet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// userNSPath is where the user namespace owning the network namespace
// pinned at netPath is pinned: DIR/userns/ID beside DIR/netns/ID.
func userNSPath(netPath string) string {
	return filepath.Join(filepath.Dir(filepath.Dir(netPath)), "userns", filepath.Base(netPath))
}

// newNetns creates a network namespace pinned at path (a bind mount of its
// nsfs file), owned by a new user namespace with the sandboxes' id mapping,
// pinned at userNSPath(path). The sandbox joins both: its root then mounts
// its own sysfs, `runc exec` can enter the sandbox (runc joins the user
// namespace first, and a network namespace the host's user namespace owns
// cannot be joined from inside it), and the sandbox still cannot change its
// network: it has no CAP_NET_ADMIN. IPv6 is disabled inside.
func newNetns(path string) (err error) {
	upath := userNSPath(path)
	if err := os.MkdirAll(filepath.Dir(upath), 0o700); err != nil {
		return err
	}
	// A holder process unshares both namespaces (a multithreaded Go
	// process cannot make a user namespace itself); they are pinned by
	// bind mounts, then it exits.
	holder := exec.Command("/bin/cat")
	stdin, err := holder.StdinPipe()
	if err != nil {
		return err
	}
	holder.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWNET,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: runtime.HostUIDBase, Size: runtime.IDMapSize}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: runtime.HostUIDBase, Size: runtime.IDMapSize}},
		// Sandbox processes call setgroups (the agent runs commands as
		// users with supplementary groups): keep it allowed.
		GidMappingsEnableSetgroups: true,
		Pdeathsig:                  unix.SIGKILL,
	}
	if err := holder.Start(); err != nil {
		return fmt.Errorf("namespace holder: %w", err)
	}
	defer func() {
		stdin.Close()
		holder.Wait()
		if err != nil {
			removeNetns(path)
		}
	}()
	for _, pin := range []struct{ ns, at string }{{"user", upath}, {"net", path}} {
		f, err := os.OpenFile(pin.at, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
		if err != nil {
			return err
		}
		f.Close()
		src := fmt.Sprintf("/proc/%d/ns/%s", holder.Process.Pid, pin.ns)
		if err := unix.Mount(src, pin.at, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("pin %s namespace: %w", pin.ns, err)
		}
	}
	return disableIPv6(path)
}

// disableIPv6 turns IPv6 off inside the network namespace at path, from a
// thread that enters it for the purpose.
func disableIPv6(path string) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			goruntime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			goruntime.UnlockOSThread()
			errc <- err
			return
		}
		for _, p := range []string{"all", "default", "lo"} {
			if werr := os.WriteFile("/proc/sys/net/ipv6/conf/"+p+"/disable_ipv6", []byte("1"), 0o644); werr != nil && err == nil {
				err = werr
			}
		}
		if serr := netns.Set(orig); serr != nil {
			// This thread stays in the sandbox's namespace: let it die
			// with the goroutine (no UnlockOSThread).
			errc <- errors.Join(err, serr)
			return
		}
		goruntime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// removeNetns unpins the namespaces at path and userNSPath(path); the
// kernel frees them (and the veth end inside) once no process is in them.
func removeNetns(path string) error {
	var errs []error
	for _, p := range []string{path, userNSPath(path)} {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount namespace %s: %w", p, err))
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// plumb makes the veth pair of one sandbox: hostName on the bridge
// (isolated from the other sandboxes' ports), eth0 with addr inside the
// namespace at nsPath, default route via the gateway.
func plumb(nsPath, hostName string, bridge netlink.Link, addr, gw netip.Prefix) error {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return err
	}
	defer ns.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: hostName, MasterIndex: bridge.Attrs().Index, MTU: bridge.Attrs().MTU},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(ns)),
	}
	if bridge.Attrs().MTU == 0 {
		veth.MTU = 1500
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("create veth %s: %w", hostName, err)
	}
	host, err := netlink.LinkByName(hostName)
	if err != nil {
		return err
	}
	os.WriteFile("/proc/sys/net/ipv6/conf/"+hostName+"/disable_ipv6", []byte("1"), 0o644)
	if err := netlink.LinkSetIsolated(host, true); err != nil {
		return fmt.Errorf("isolate bridge port: %w", err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return err
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := h.LinkSetUp(lo); err != nil {
		return err
	}
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return err
	}
	if err := h.AddrAdd(eth, &netlink.Addr{IPNet: ipnet(addr)}); err != nil {
		return err
	}
	if err := h.LinkSetUp(eth); err != nil {
		return err
	}
	return h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.IP(gw.Addr().AsSlice())})
}

// delLink removes a link by name if it exists.
func delLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	}
	return netlink.LinkDel(l)
}

// hostOverlap returns a description of the first host network (address or
// route, other than on the bridge itself) that overlaps cidr.
func hostOverlap(cidr netip.Prefix, bridge string) (string, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return "", err
	}
	for _, l := range links {
		if l.Attrs().Name == bridge || l.Attrs().MasterIndex != 0 && isOurPort(l, bridge) {
			continue
		}
		addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4)
		for _, a := range addrs {
			ip, _ := netip.AddrFromSlice(a.IP.To4())
			ones, _ := a.Mask.Size()
			p := netip.PrefixFrom(ip, ones).Masked()
			if p.Overlaps(cidr) {
				return fmt.Sprintf("address %s of %s", a.IPNet, l.Attrs().Name), nil
			}
		}
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return "", err
	}
	brIdx := -1
	if l, err := netlink.LinkByName(bridge); err == nil {
		brIdx = l.Attrs().Index
	}
	for _, r := range routes {
		if r.Dst == nil || r.LinkIndex == brIdx || r.Type != unix.RTN_UNICAST {
			continue
		}
		ip, _ := netip.AddrFromSlice(r.Dst.IP.To4())
		ones, _ := r.Dst.Mask.Size()
		if ones == 0 {
			continue // the default route overlaps everything
		}
		if netip.PrefixFrom(ip, ones).Masked().Overlaps(cidr) {
			return fmt.Sprintf("route %s", r.Dst), nil
		}
	}
	return "", nil
}

func isOurPort(l netlink.Link, bridge string) bool {
	m, err := netlink.LinkByIndex(l.Attrs().MasterIndex)
	return err == nil && m.Attrs().Name == bridge
}
