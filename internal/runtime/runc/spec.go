package runc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"

	dockerseccomp "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nookhq/nook/internal/agentwire"
	"github.com/nookhq/nook/internal/runtime"
	"github.com/nookhq/nook/internal/seccomp"
)

// defaultCaps is Docker's default capability set less CAP_NET_RAW. The
// sandbox's network namespace belongs to its own user namespace, so raw
// sockets would let its root forge source addresses and ARP answers on the
// shared bridge (taking another sandbox's traffic or policy).
var defaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

var maskedPaths = []string{
	"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
	"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
	"/sys/firmware", "/sys/devices/virtual/powercap",
}

var readonlyPaths = []string{
	"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
}

// ociSpec builds the OCI runtime config for one sandbox whose root
// filesystem is already mounted at rootfs.
func ociSpec(s runtime.Spec, rootfs, cgroupsPath string) (*specs.Spec, error) {
	caps := append([]string(nil), defaultCaps...)
	cwd := s.Cwd
	if cwd == "" {
		cwd = "/"
	}
	spec := &specs.Spec{
		Version:  specs.Version,
		Hostname: s.Hostname,
		Root:     &specs.Root{Path: rootfs},
		Process: &specs.Process{
			Args: s.Args,
			Env:  s.Env,
			Cwd:  cwd,
			User: specs.User{UID: 0, GID: 0},
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			NoNewPrivileges: true,
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
		},
		Linux: &specs.Linux{
			UIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: runtime.HostUIDBase, Size: runtime.IDMapSize}},
			GIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: runtime.HostUIDBase, Size: runtime.IDMapSize}},
			CgroupsPath: cgroupsPath,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
				{Type: specs.MountNamespace}, {Type: specs.UserNamespace, Path: s.UserNSPath}, {Type: specs.CgroupNamespace},
				{Type: specs.NetworkNamespace, Path: s.NetNSPath},
			},
			MaskedPaths:   maskedPaths,
			ReadonlyPaths: readonlyPaths,
			Resources:     resources(s.Limits),
		},
	}
	for _, m := range s.Mounts {
		opts := []string{"rbind", "nosuid", "nodev"}
		if m.ReadOnly {
			opts = append(opts, "ro")
		}
		spec.Mounts = append(spec.Mounts, specs.Mount{Destination: m.Target, Type: "bind", Source: m.Source, Options: opts})
	}
	sc, err := defaultSeccomp(spec)
	if err != nil {
		return nil, fmt.Errorf("seccomp profile: %w", err)
	}
	spec.Linux.Seccomp = sc
	return spec, nil
}

// seccompCache holds Docker's default profile per capability set: it is
// the same for every sandbox, and building it is a measurable part of a
// create. The cached profiles are shared and never modified.
var seccompCache sync.Map // strings.Join(caps) -> *specs.LinuxSeccomp

// nativeSeccompArch is the seccomp architecture of each Go architecture
// nook runs on.
var nativeSeccompArch = map[string]specs.Arch{"amd64": specs.ArchX86_64, "arm64": specs.ArchAARCH64}

func defaultSeccomp(spec *specs.Spec) (*specs.LinuxSeccomp, error) {
	key := strings.Join(spec.Process.Capabilities.Bounding, ",")
	if sc, ok := seccompCache.Load(key); ok {
		return sc.(*specs.LinuxSeccomp), nil
	}
	sc, err := dockerseccomp.GetDefaultProfile(spec)
	if err != nil {
		return nil, err
	}
	// Only the native system call ABI: runc compiles the filter once per
	// architecture listed, at every start, and the 32-bit ABIs (x86, x32)
	// Docker also allows cost 17 of a create's ~70 ms in runc and open a
	// second, rarely audited system call table to the sandbox. System
	// calls of other ABIs are refused by the kernel filter.
	if arch, ok := nativeSeccompArch[goruntime.GOARCH]; ok {
		sc.Architectures = []specs.Arch{arch}
	}
	seccompCache.Store(key, sc)
	return sc, nil
}

func resources(l runtime.Limits) *specs.LinuxResources {
	r := &specs.LinuxResources{
		// Deny every device but the default ones runc always allows.
		Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
	}
	if l.MemoryBytes > 0 {
		mem, swap := l.MemoryBytes, l.MemoryBytes
		r.Memory = &specs.LinuxMemory{Limit: &mem, Swap: &swap}
	}
	if l.CPUMillis > 0 {
		period := uint64(100000)
		quota := l.CPUMillis * 100
		r.CPU = &specs.LinuxCPU{Period: &period, Quota: &quota}
	}
	if l.PidsMax > 0 {
		r.Pids = &specs.LinuxPids{Limit: l.PidsMax}
	}
	return r
}

// writeSeccompFilter compiles the sandboxes' seccomp profile (Docker's
// default for defaultCaps) into path and returns path, or "" when nook's
// compiler does not handle this machine (runc compiles it then).
func writeSeccompFilter(path string) (string, error) {
	caps := append([]string(nil), defaultCaps...)
	sc, err := defaultSeccomp(&specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: caps}}})
	if err != nil {
		return "", fmt.Errorf("seccomp profile: %w", err)
	}
	prog, err := seccomp.Compile(sc)
	if errors.Is(err, seccomp.ErrUnsupported) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("compile seccomp profile: %w", err)
	}
	data, err := seccomp.Marshal(prog)
	if err != nil {
		return "", err
	}
	// Written beside and renamed: a sandbox starting now mounts either
	// the old file or the new one, never a half-written one.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return "", err
	}
	return path, os.Rename(tmp, path)
}

// compiledMarker, in a bundle, says the sandbox's seccomp filter is
// installed by the agent (so `runc exec` must go through it too). It is
// host-side: the sandbox cannot remove it.
const compiledMarker = "seccomp-exec"

// useCompiledSeccomp makes spec install nook's compiled filter instead of
// having runc compile the profile: the filter file is mounted read-only
// and PID 1 starts through the agent's seccomp-exec, which installs it
// before anything of the sandbox runs (no_new_privs is already set).
func useCompiledSeccomp(bundle string, spec *specs.Spec, filter string) error {
	if len(spec.Process.Args) == 0 || spec.Process.Args[0] != agentwire.AgentPath {
		return fmt.Errorf("compiled seccomp needs the agent as PID 1, not %v", spec.Process.Args)
	}
	spec.Linux.Seccomp = nil
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: agentwire.SeccompFilterPath, Type: "bind", Source: filter,
		Options: []string{"rbind", "nosuid", "nodev", "ro"}})
	spec.Process.Args = seccompWrapped(spec.Process.Args)
	return os.WriteFile(filepath.Join(bundle, compiledMarker), nil, 0o600)
}

// seccompWrapped is argv started through the agent's seccomp-exec.
func seccompWrapped(argv []string) []string {
	return append([]string{agentwire.AgentPath, agentwire.SeccompExecCmd, agentwire.SeccompFilterPath, "--"}, argv...)
}
