package seccomp

import (
	"encoding/binary"
	"testing"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// dockerProfile is Docker's default profile for Docker's default
// capabilities (no CAP_SYS_ADMIN), native ABI only, as nook's runc driver
// uses it.
func dockerProfile(t testing.TB) *specs.LinuxSeccomp {
	t.Helper()
	caps := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
		"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
		"CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"}
	spec := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: caps}}}
	p, err := seccomp.GetDefaultProfile(spec)
	if err != nil {
		t.Fatal(err)
	}
	p.Architectures = []specs.Arch{specs.ArchX86_64}
	return p
}

// run emulates the filter on one system call. The VM loads 32-bit words
// big-endian (packet order) where the kernel loads them in host order, so
// each word of seccomp_data is written big-endian here.
func run(t *testing.T, vm *bpf.VM, arch, nr uint32, args ...uint64) uint32 {
	t.Helper()
	data := make([]byte, 64)
	binary.BigEndian.PutUint32(data[0:], nr)
	binary.BigEndian.PutUint32(data[4:], arch)
	for i, a := range args {
		binary.BigEndian.PutUint32(data[16+8*i:], uint32(a))
		binary.BigEndian.PutUint32(data[20+8*i:], uint32(a>>32))
	}
	r, err := vm.Run(data)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(r)
}

func compiled(t *testing.T, p *specs.LinuxSeccomp) *bpf.VM {
	t.Helper()
	prog, err := Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	vm, err := bpf.NewVM(prog)
	if err != nil {
		t.Fatal(err)
	}
	return vm
}

const eperm, enosys = retErrno | uint32(unix.EPERM), retErrno | uint32(unix.ENOSYS)

func TestDockerProfileDecisions(t *testing.T) {
	p := dockerProfile(t)
	vm := compiled(t, p)
	// Every unconditionally allowed name of the profile is allowed.
	for _, sc := range p.Syscalls {
		if sc.Action != specs.ActAllow || len(sc.Args) > 0 {
			continue
		}
		for _, name := range sc.Names {
			if nr, ok := sysnumAMD64[name]; ok {
				if got := run(t, vm, auditArchX86_64, nr); got != retAllow {
					t.Errorf("%s (%d): %#x, want allow", name, nr, got)
				}
			}
		}
	}
	for _, c := range []struct {
		what string
		arch uint32
		nr   uint32
		args []uint64
		want uint32
	}{
		{"mount is not in the profile", auditArchX86_64, unix.SYS_MOUNT, nil, eperm},
		{"keyctl", auditArchX86_64, unix.SYS_KEYCTL, nil, eperm},
		{"unshare", auditArchX86_64, unix.SYS_UNSHARE, nil, eperm},
		{"clone without namespace flags", auditArchX86_64, unix.SYS_CLONE, []uint64{uint64(unix.SIGCHLD)}, retAllow},
		{"clone of a thread", auditArchX86_64, unix.SYS_CLONE, []uint64{unix.CLONE_VM | unix.CLONE_THREAD | unix.CLONE_SIGHAND}, retAllow},
		{"clone with CLONE_NEWUSER", auditArchX86_64, unix.SYS_CLONE, []uint64{unix.CLONE_NEWUSER | uint64(unix.SIGCHLD)}, eperm},
		{"clone with CLONE_NEWNS", auditArchX86_64, unix.SYS_CLONE, []uint64{unix.CLONE_NEWNS}, eperm},
		{"clone3 falls back to clone", auditArchX86_64, unix.SYS_CLONE3, nil, enosys},
		{"socket AF_UNIX", auditArchX86_64, unix.SYS_SOCKET, []uint64{unix.AF_UNIX}, retAllow},
		{"socket AF_INET", auditArchX86_64, unix.SYS_SOCKET, []uint64{unix.AF_INET}, retAllow},
		{"socket AF_NETLINK", auditArchX86_64, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK}, retAllow},
		{"socket AF_VSOCK", auditArchX86_64, unix.SYS_SOCKET, []uint64{unix.AF_VSOCK}, eperm},
		{"socket AF_INET with high bits", auditArchX86_64, unix.SYS_SOCKET, []uint64{1<<32 | unix.AF_INET}, eperm},
		{"personality 0", auditArchX86_64, unix.SYS_PERSONALITY, []uint64{0}, retAllow},
		{"personality query", auditArchX86_64, unix.SYS_PERSONALITY, []uint64{0xffffffff}, retAllow},
		{"personality READ_IMPLIES_EXEC", auditArchX86_64, unix.SYS_PERSONALITY, []uint64{0x0400000}, eperm},
		{"i386 ABI", 0x40000003, 20, nil, retKillProcess},
		{"x32 ABI", auditArchX86_64, x32SyscallBit | unix.SYS_GETPID, nil, retKillProcess},
		{"unknown future call", auditArchX86_64, 1000, nil, enosys},
		{"unused number below the newest", auditArchX86_64, 387, nil, eperm},
	} {
		if got := run(t, vm, c.arch, c.nr, c.args...); got != c.want {
			t.Errorf("%s: %#x, want %#x", c.what, got, c.want)
		}
	}
}

func TestComparisons(t *testing.T) {
	const nr = unix.SYS_GETPID
	for _, c := range []struct {
		op     specs.LinuxSeccompOperator
		value  uint64
		arg    uint64
		allows bool
	}{
		{specs.OpEqualTo, 5, 5, true}, {specs.OpEqualTo, 5, 5 | 1<<32, false},
		{specs.OpNotEqual, 5, 5, false}, {specs.OpNotEqual, 5, 6, true}, {specs.OpNotEqual, 5, 5 | 1<<40, true},
		{specs.OpLessThan, 1 << 33, 1<<33 - 1, true}, {specs.OpLessThan, 1 << 33, 1 << 33, false}, {specs.OpLessThan, 7, 1 << 32, false},
		{specs.OpLessEqual, 7, 7, true}, {specs.OpLessEqual, 7, 8, false}, {specs.OpLessEqual, 1 << 32, 3, true},
		{specs.OpGreaterThan, 7, 8, true}, {specs.OpGreaterThan, 7, 7, false}, {specs.OpGreaterThan, 1 << 32, 9, false}, {specs.OpGreaterThan, 9, 1 << 32, true},
		{specs.OpGreaterEqual, 7, 7, true}, {specs.OpGreaterEqual, 7, 6, false}, {specs.OpGreaterEqual, 1<<32 | 5, 1<<32 | 5, true},
	} {
		p := &specs.LinuxSeccomp{DefaultAction: specs.ActErrno, Architectures: []specs.Arch{specs.ArchX86_64},
			Syscalls: []specs.LinuxSyscall{{Names: []string{"getpid"}, Action: specs.ActAllow,
				Args: []specs.LinuxSeccompArg{{Index: 2, Value: c.value, Op: c.op}}}}}
		got := run(t, compiled(t, p), auditArchX86_64, nr, 0, 0, c.arg)
		if (got == retAllow) != c.allows {
			t.Errorf("arg %#x %s %#x: %#x, want allowed=%v", c.arg, c.op, c.value, got, c.allows)
		}
	}
	// Two comparisons in one rule must both hold; rules are alternatives.
	p := &specs.LinuxSeccomp{DefaultAction: specs.ActErrno, Architectures: []specs.Arch{specs.ArchX86_64},
		Syscalls: []specs.LinuxSyscall{
			{Names: []string{"getpid"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: 1, Op: specs.OpEqualTo}, {Index: 1, Value: 2, Op: specs.OpEqualTo}}},
			{Names: []string{"getpid"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: 9, Op: specs.OpEqualTo}}},
		}}
	vm := compiled(t, p)
	for _, c := range []struct {
		args   []uint64
		allows bool
	}{{[]uint64{1, 2}, true}, {[]uint64{1, 3}, false}, {[]uint64{2, 2}, false}, {[]uint64{9, 0}, true}} {
		if got := run(t, vm, auditArchX86_64, nr, c.args...); (got == retAllow) != c.allows {
			t.Errorf("args %v: %#x, want allowed=%v", c.args, got, c.allows)
		}
	}
}

func TestUnsupportedProfiles(t *testing.T) {
	for name, p := range map[string]*specs.LinuxSeccomp{
		"two architectures": {DefaultAction: specs.ActErrno, Architectures: []specs.Arch{specs.ArchX86_64, specs.ArchX86}},
		"notify action": {DefaultAction: specs.ActErrno, Architectures: []specs.Arch{specs.ArchX86_64},
			Syscalls: []specs.LinuxSyscall{{Names: []string{"read"}, Action: specs.ActNotify}}},
		"listener": {DefaultAction: specs.ActErrno, Architectures: []specs.Arch{specs.ArchX86_64}, ListenerPath: "/x"},
	} {
		if _, err := Compile(p); err == nil {
			t.Errorf("%s: compiled, want an error", name)
		}
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	prog, err := Compile(dockerProfile(t))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Marshal(prog)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := bpf.Assemble(prog)
	if len(b) != 8*len(raw) {
		t.Fatalf("%d bytes for %d instructions", len(b), len(raw))
	}
	t.Logf("Docker's default profile: %d instructions", len(raw))
}

// BenchmarkCompileDockerProfile: what nook serve pays once per start (and
// runc, with libseccomp, paid per sandbox start).
func BenchmarkCompileDockerProfile(b *testing.B) {
	p := dockerProfile(b)
	for b.Loop() {
		prog, err := Compile(p)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Marshal(prog); err != nil {
			b.Fatal(err)
		}
	}
}
