package integration

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// dockerDefaultCapEff is Docker's default capability set less NET_RAW as
// /proc/PID/status prints it (CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID
// SETUID SETPCAP NET_BIND_SERVICE SYS_CHROOT MKNOD AUDIT_WRITE SETFCAP).
const dockerDefaultCapEff = "00000000a80405fb"

func randomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// shellQuote quotes s for bash.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// TestIsolation tries, from inside sandboxes, to break each claim of the
// README's security model.
func TestIsolation(t *testing.T) {
	a := createSandbox(t)
	b := createSandbox(t)

	t.Run("HostFilesAreUnreachable", func(t *testing.T) {
		secret := "nook-host-secret-" + randomHex(t, 12)
		name := "nook-secret-" + randomHex(t, 6)
		path := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(path, []byte(secret+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, user := range []string{"root", "user"} {
			mustFail(t, a, user, "read a host file by its path", "cat "+shellQuote(path))
			mustFail(t, a, user, "read a host file through /proc/1/root", "cat "+shellQuote("/proc/1/root"+path))
		}
		// Search the whole visible tree by name and the usual places by
		// content; neither may find the host's file.
		out := mustRun(t, a, "root", fmt.Sprintf(
			`find / \( -path /proc -o -path /sys \) -prune -o -name %s -print 2>/dev/null; `+
				`grep -rsl -F %s /tmp /root /home /etc /var /mnt /opt /srv /run /.nook /dev/shm 2>/dev/null; true`,
			shellQuote(name), shellQuote(secret)))
		if strings.TrimSpace(out) != "" {
			t.Errorf("SECURITY: sandbox %s found the host's secret file: %s", a, out)
		}
		// The host's data dir (templates, other sandboxes' bundles) is not
		// in the sandbox.
		mustFail(t, a, "root", "reach nook's data dir", "ls "+shellQuote(filepath.Join(dataDir, "bundles")))
		// PID 1 in the sandbox is its agent, not the host's init: its root
		// is the sandbox's root.
		if got := mustRun(t, a, "root", "tr '\\0' ' ' </proc/1/cmdline"); !strings.Contains(got, "nook-agent") {
			t.Errorf("SECURITY: sandbox %s: /proc/1 is %q, not the sandbox's agent", a, got)
		}
		if r := root(t, a, "readlink /proc/1/root"); r.Code == 0 && strings.TrimSpace(r.Stdout) != "/" {
			t.Errorf("sandbox %s: /proc/1/root links to %q, want / (or unreadable)", a, r.Stdout)
		}
		// The API key only lives in nook serve's command line on the host.
		// (The key goes in through a file so that grep's own command line
		// does not contain it.)
		keyB64 := base64.StdEncoding.EncodeToString([]byte(apiKey))
		if out := mustRun(t, a, "root", "echo "+keyB64+" | base64 -d > /tmp/k && grep -lsFf /tmp/k /proc/[0-9]*/cmdline /proc/[0-9]*/environ; rm -f /tmp/k; true"); strings.TrimSpace(out) != "" {
			t.Errorf("SECURITY: sandbox %s sees nook's API key in %s", a, out)
		}
	})

	t.Run("ChrootEscapeStaysInSandbox", func(t *testing.T) {
		// CAP_SYS_CHROOT is in Docker's set: the classic double-chroot
		// escape must end at the sandbox's root (pivot_root), not the host's.
		script := `import os
os.makedirs("/tmp/jail", exist_ok=True)
fd = os.open("/", os.O_RDONLY)
os.chroot("/tmp/jail")
os.fchdir(fd)
for _ in range(64):
    os.chdir("..")
os.chroot(".")
print("agent" if os.path.exists("/.nook/bin/nook-agent") else "no-agent")
print("hostdata" if os.path.exists(` + strconv.Quote(dataDir) + `) else "no-hostdata")
`
		out := mustRun(t, a, "root", "python3 -c "+shellQuote(script))
		if got := strings.Join(strings.Fields(out), " "); got != "agent no-hostdata" {
			t.Errorf("SECURITY: chroot escape in sandbox %s reached outside its root: %q", a, out)
		}
	})

	t.Run("HostnameIsSandboxID", func(t *testing.T) {
		hostName, _ := os.Hostname()
		hostEtc, _ := os.ReadFile("/etc/hostname")
		for _, id := range []string{a, b} {
			got := strings.TrimSpace(mustRun(t, id, "user", "hostname"))
			if got != id {
				t.Errorf("sandbox %s: hostname is %q, want its id", id, got)
			}
			if got == hostName {
				t.Errorf("SECURITY: sandbox %s has the host's hostname %q", id, got)
			}
			if h := strings.TrimSpace(string(hostEtc)); h != "" {
				etc := runAs(t, id, "user", "cat /etc/hostname", time.Minute)
				if etc.Code == 0 && strings.TrimSpace(etc.Stdout) == h {
					t.Errorf("SECURITY: sandbox %s shows the host's /etc/hostname %q", id, h)
				}
			}
		}
		mustFail(t, a, "root", "change the hostname (needs CAP_SYS_ADMIN)", "hostname changed-by-sandbox")
		mustFail(t, a, "root", "open a raw socket (forged addresses, ARP on the bridge)",
			`python3 -c "import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)"`)
		mustFail(t, a, "root", "take eth0 down (needs CAP_NET_ADMIN)", "ip link set eth0 down || ip link set lo down")
		// Sandboxes share the host's session keyring (runc --no-new-keyring):
		// the keyring syscalls must stay denied.
		mustFail(t, a, "root", "use the session keyring (keyctl)",
			`python3 -c "import ctypes,sys; sys.exit(0 if ctypes.CDLL(None).syscall(250, 0, -3, 0) >= 0 else 1)"`)
		if after, _ := os.Hostname(); after != hostName {
			t.Errorf("SECURITY: the host's hostname changed from %q to %q", hostName, after)
		}
	})

	t.Run("ProcessesAreIsolated", func(t *testing.T) {
		marker := fmt.Sprintf("sleep %d", 12345)
		mustRun(t, a, "user", "nohup sleep 12345 >/dev/null 2>&1 &")
		// Positive control: A sees its own sleep.
		if out := mustRun(t, a, "user", "ps -eo args"); !strings.Contains(out, marker) {
			t.Fatalf("sandbox %s does not see its own %q: %s", a, marker, out)
		}
		// B sees neither A's processes nor the host's.
		out := mustRun(t, b, "root", "ps -eo pid=,comm=,args=")
		if strings.Contains(out, marker) {
			t.Errorf("SECURITY: sandbox %s sees sandbox %s's process %q:\n%s", b, a, marker, out)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) > 10 {
			t.Errorf("SECURITY: sandbox %s sees %d processes (host's?):\n%s", b, len(lines), out)
		}
		for _, l := range lines {
			f := strings.Fields(l)
			if len(f) < 2 {
				continue
			}
			switch f[1] {
			case "nook-agent", "bash", "ps":
			default:
				t.Errorf("SECURITY: sandbox %s sees a process that is not its own: %q", b, l)
			}
			if f[0] == "1" && f[1] != "nook-agent" {
				t.Errorf("sandbox %s: PID 1 is %q, want nook-agent", b, l)
			}
		}
		if serve := srv.PID(); serve > 0 {
			if ok, _ := attempt(t, b, "root", fmt.Sprintf("test -e /proc/%d && grep -q serve /proc/%d/cmdline", serve, serve)); ok {
				t.Errorf("SECURITY: sandbox %s sees nook serve (host pid %d)", b, serve)
			}
		}
		// B's root cannot signal A's sleep by its host pid.
		hostPid := findHostProcess(t, a, "sleep\x0012345")
		if hostPid == 0 {
			t.Fatalf("host: no process of sandbox %s runs %q", a, marker)
		}
		runAs(t, b, "root", fmt.Sprintf("kill -9 %d", hostPid), time.Minute)
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", hostPid)); err != nil {
			t.Errorf("SECURITY: sandbox %s killed sandbox %s's process (host pid %d)", b, a, hostPid)
		}
		if out := mustRun(t, a, "user", "ps -eo args"); !strings.Contains(out, marker) {
			t.Errorf("SECURITY: sandbox %s's %q is gone after sandbox %s tried to kill it", a, marker, b)
		}
	})

	t.Run("FilesystemsAreSeparate", func(t *testing.T) {
		marker := "nook-cross-" + randomHex(t, 6)
		mustRun(t, a, "root", fmt.Sprintf("echo %s > /etc/%s && echo %s >> /etc/passwd && echo x > /usr/bin/%s", marker, marker, marker, marker))
		if out := mustRun(t, b, "root", fmt.Sprintf("ls /etc/%s /usr/bin/%s 2>/dev/null; grep -c %s /etc/passwd; true", marker, marker, marker)); strings.TrimSpace(out) != "0" {
			t.Errorf("SECURITY: sandbox %s sees what sandbox %s wrote to its root: %q", b, a, out)
		}
		// The template's read-only layers are untouched (copy-up only).
		hits, _ := filepath.Glob(filepath.Join(dataDir, "templates", "*", "*", "etc", marker))
		hits2, _ := filepath.Glob(filepath.Join(dataDir, "templates", "*", "etc", marker))
		if len(hits)+len(hits2) > 0 {
			t.Errorf("SECURITY: sandbox %s wrote into the template: %v %v", a, hits, hits2)
		}
		// A new sandbox starts from the pristine template.
		c := createSandbox(t)
		if out := mustRun(t, c, "root", fmt.Sprintf("grep -c %s /etc/passwd; true", marker)); strings.TrimSpace(out) != "0" {
			t.Errorf("SECURITY: a new sandbox inherited sandbox %s's changes: %q", a, out)
		}
	})

	t.Run("AgentBinaryIsReadOnly", func(t *testing.T) {
		before := fileHash(t, agentBin)
		mustFail(t, a, "root", "append to the bind-mounted agent binary", "echo x >> /.nook/bin/nook-agent")
		mustFail(t, a, "root", "open PID 1's executable for writing", `python3 -c "open('/proc/1/exe','ab').write(b'x')"`)
		mustFail(t, a, "root", "remount the agent binary read-write", "mount -o remount,rw,bind /.nook/bin/nook-agent")
		if after := fileHash(t, agentBin); after != before {
			t.Errorf("SECURITY: sandbox %s modified the host's nook-agent binary", a)
		}
	})

	t.Run("AgentSocketIsRootOnly", func(t *testing.T) {
		// The sandbox's unprivileged user must not reach the agent directly
		// (POST /init on the socket would reset the access token).
		mustFail(t, a, "user", "connect to the agent's socket as the unprivileged user",
			"curl -sS -m 3 -f --unix-socket /.nook/run/agent.sock http://agent/health")
	})

	t.Run("MountIsDenied", func(t *testing.T) {
		for _, cmd := range []string{
			"mount -t tmpfs none /mnt",
			"mount -t proc proc /mnt",
			"mount -t cgroup -o memory cgroup /mnt",
			"mount --bind / /mnt",
			"mount -o remount,rw /sys",
			"mount -o remount,rw /proc/sys",
		} {
			mustFail(t, a, "root", "mount", cmd)
		}
		if out := mustRun(t, a, "root", "awk '$5 == \"/mnt\"' /proc/self/mountinfo"); strings.TrimSpace(out) != "" {
			t.Errorf("SECURITY: sandbox %s mounted on /mnt: %s", a, out)
		}
	})

	t.Run("KernelModulesAreDenied", func(t *testing.T) {
		// x86_64 numbers: init_module 175, delete_module 176, finit_module
		// 313, kexec_load 246, reboot 169 (bad magic), swapon 167. Each must
		// fail with EPERM (seccomp or a missing capability) or ENOSYS.
		script := `import ctypes
libc = ctypes.CDLL(None, use_errno=True)
for name, nr, args in [("init_module", 175, (0, 0, 0)), ("delete_module", 176, (0, 0)),
                       ("finit_module", 313, (-1, 0, 0)), ("kexec_load", 246, (0, 0, 0, 0)),
                       ("reboot", 169, (0, 0, 0, 0)), ("swapon", 167, (0, 0))]:
    r = libc.syscall(nr, *args)
    print(name, r, ctypes.get_errno())
`
		out := mustRun(t, a, "root", "python3 -c "+shellQuote(script))
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(l)
			if len(f) != 3 {
				t.Fatalf("unexpected output %q", out)
			}
			if f[1] != "-1" || (f[2] != "1" && f[2] != "38") {
				t.Errorf("SECURITY: sandbox %s: syscall %s returned %s errno %s, want -1 with EPERM (or ENOSYS)", a, f[0], f[1], f[2])
			}
		}
		for _, tool := range []string{"modprobe", "insmod"} {
			mustFail(t, a, "root", "load a kernel module", fmt.Sprintf("command -v %s && %s dummy", tool, tool))
		}
	})

	t.Run("AgentSocketIsNotReachableFromInside", func(t *testing.T) {
		// nook's side of the agent (/init sets the access token) is a
		// socket owned by the host's root: the sandbox's root may see it
		// but not connect to it.
		script := `import socket
s = socket.socket(socket.AF_UNIX)
try:
    s.connect("/.nook/run/agent.sock")
    s.sendall(b"GET /health HTTP/1.0\r\n\r\n")
    print("CONNECTED", s.recv(100))
except OSError as e:
    print("refused", e)
`
		out := mustRun(t, a, "root", "python3 -c "+shellQuote(script))
		if !strings.Contains(out, "refused") {
			t.Errorf("SECURITY: sandbox %s's root reached the agent's socket: %s", a, out)
		}
	})

	t.Run("LegacySyscallABIIsRefused", func(t *testing.T) {
		// The 32-bit system call ABI (int 0x80) reaches a second syscall
		// table; the seccomp filter admits only the native one. The
		// machine code is "mov eax, 20 (i386 getpid); int 0x80; ret": if
		// it returns the pid, the 32-bit ABI is open.
		script := `import ctypes, mmap, os
code = bytes([0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0xc3])
m = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(code)
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
r = ctypes.CFUNCTYPE(ctypes.c_int)(addr)()
print("ran", r, os.getpid())
`
		r := runAs(t, a, "root", "python3 -c "+shellQuote(script)+"; echo exit=$?", time.Minute)
		out := r.Stdout
		if !strings.Contains(out, "exit=") {
			t.Fatalf("unexpected result %s", r)
		}
		if f := strings.Fields(out); len(f) >= 3 && f[0] == "ran" && f[1] == f[2] {
			t.Errorf("SECURITY: sandbox %s: i386 getpid through int 0x80 answered %s (the 32-bit ABI is open)", a, f[1])
		}
		// Killed by SIGSYS (128+31) or refused with an errno: either way no pid.
		t.Logf("int 0x80 attempt: %s", strings.TrimSpace(out))
	})

	t.Run("ProcSysIsReadOnly", func(t *testing.T) {
		// Opening for writing must fail; nothing is written if it did not.
		var paths []string
		for _, p := range []string{
			"/proc/sys/kernel/sysrq", "/proc/sys/kernel/core_pattern", "/proc/sys/kernel/panic",
			"/proc/sys/kernel/modprobe", "/proc/sys/kernel/modules_disabled", "/proc/sys/vm/overcommit_memory",
			"/proc/sys/kernel/hostname", "/proc/sys/net/ipv4/ip_forward", "/proc/sysrq-trigger",
			"/sys/kernel/uevent_helper", "/sys/kernel/mm/transparent_hugepage/enabled", "/sys/power/state",
		} {
			if _, err := os.Stat(p); err == nil {
				paths = append(paths, p)
			}
		}
		if len(paths) == 0 {
			t.Fatal("none of the probed /proc/sys and /sys files exists on this host")
		}
		script := `import os, sys
for p in sys.argv[1:]:
    try:
        fd = os.open(p, os.O_WRONLY)
    except OSError as e:
        print("denied", p, e.errno)
    else:
        os.close(fd)
        print("WRITABLE", p)
`
		for _, user := range []string{"root", "user"} {
			out := mustRun(t, a, user, "python3 -c "+shellQuote(script)+" "+strings.Join(paths, " "))
			if strings.Contains(out, "WRITABLE") || strings.Count(out, "denied") != len(paths) {
				t.Errorf("SECURITY: sandbox %s as %s could open host kernel settings for writing:\n%s", a, user, out)
			}
		}
		// A real write of the current value (a no-op if it went through).
		for _, p := range []string{"/proc/sys/kernel/sysrq", "/proc/sys/kernel/panic"} {
			if _, err := os.Stat(p); err == nil {
				mustFail(t, a, "root", "write "+p, fmt.Sprintf("v=$(cat %s) && echo \"$v\" > %s", p, p))
			}
		}
		// Masked files read as nothing.
		for _, p := range []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug"} {
			if _, err := os.Stat(p); err != nil {
				continue
			}
			out := runAs(t, a, "root", "head -c 64 "+p+" | wc -c", time.Minute)
			if out.Code != 0 || strings.TrimSpace(out.Stdout) != "0" {
				t.Errorf("SECURITY: sandbox %s can read masked %s: %s", a, p, out)
			}
		}
	})

	t.Run("CgroupsAreReadOnly", func(t *testing.T) {
		script := `import glob, os
names = ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "memory.max", "pids.max",
         "cpu.cfs_quota_us", "cpu.max", "cgroup.procs", "release_agent", "notify_on_release", "devices.allow"]
paths = [p for n in names for p in glob.glob("/sys/fs/cgroup/" + n) + glob.glob("/sys/fs/cgroup/*/" + n)]
print("probed", len(paths))
for p in paths:
    try:
        fd = os.open(p, os.O_WRONLY)
    except OSError as e:
        pass
    else:
        os.close(fd)
        print("WRITABLE", p)
`
		out := mustRun(t, a, "root", "python3 -c "+shellQuote(script))
		if strings.Contains(out, "WRITABLE") {
			t.Errorf("SECURITY: sandbox %s can write its cgroup limits:\n%s", a, out)
		}
		if strings.Contains(out, "probed 0") {
			t.Errorf("sandbox %s sees no cgroup files at all: %s", a, out)
		}
		// Host view: the limits the template promises are in place.
		if v, ok := cgroupRead(a, "pids", "pids.max"); !ok || v != "1024" {
			t.Errorf("sandbox %s: pids.max is %q (found %v), want 1024", a, v, ok)
		}
		mem, ok := cgroupRead(a, "memory", "memory.limit_in_bytes")
		if !ok {
			mem, ok = cgroupRead(a, "memory", "memory.max")
		}
		if !ok || mem != strconv.Itoa(2000<<20) {
			t.Errorf("sandbox %s: memory limit is %q (found %v), want %d", a, mem, ok, 2000<<20)
		}
		if dl, ok := cgroupRead(a, "devices", "devices.list"); ok && strings.Contains(dl, "a *:* rwm") {
			t.Errorf("SECURITY: sandbox %s's device cgroup allows every device: %s", a, dl)
		}
	})

	t.Run("DevicesAreDenied", func(t *testing.T) {
		for _, dir := range []string{"/tmp", "/root", "/dev/shm", "/dev"} {
			dev := dir + "/nook-sda"
			// Creating the node may fail; if it does not, opening it must.
			mustFail(t, a, "root", "create and read a block device", fmt.Sprintf("mknod %s b 8 0 && head -c 1 %s >/dev/null", dev, dev))
			mustFail(t, a, "root", "create and read /dev/mem", fmt.Sprintf("mknod %s-mem c 1 1 && head -c 1 %s-mem >/dev/null", dev, dev))
		}
		if out := mustRun(t, a, "root", "find / \\( -path /proc -o -path /sys \\) -prune -o -type b -print 2>/dev/null; true"); strings.TrimSpace(out) != "" {
			t.Errorf("SECURITY: sandbox %s has block devices: %s", a, out)
		}
		want := map[string]bool{"null": true, "zero": true, "full": true, "random": true, "urandom": true,
			"tty": true, "pts": true, "shm": true, "mqueue": true, "ptmx": true, "fd": true,
			"stdin": true, "stdout": true, "stderr": true, "console": true}
		for _, n := range strings.Fields(mustRun(t, b, "root", "ls -A /dev")) {
			if !want[n] {
				t.Errorf("SECURITY: sandbox %s has /dev/%s beyond the minimal set", b, n)
			}
		}
	})

	t.Run("PrivilegesCannotBeRaised", func(t *testing.T) {
		status := mustRun(t, a, "root", "cat /proc/self/status")
		for key, want := range map[string]string{
			"NoNewPrivs": "1", "CapEff": dockerDefaultCapEff, "CapPrm": dockerDefaultCapEff,
			"CapBnd": dockerDefaultCapEff, "CapAmb": "0000000000000000", "Seccomp": "2",
		} {
			if got := statusField(status, key); got != want {
				t.Errorf("SECURITY: sandbox %s root's %s is %q, want %q", a, key, got, want)
			}
		}
		ustatus := mustRun(t, a, "user", "cat /proc/self/status")
		for key, want := range map[string]string{"NoNewPrivs": "1", "CapEff": "0000000000000000", "Seccomp": "2"} {
			if got := statusField(ustatus, key); got != want {
				t.Errorf("SECURITY: sandbox %s user's %s is %q, want %q", a, key, got, want)
			}
		}
		for _, f := range []string{"uid_map", "gid_map"} {
			got := strings.Fields(mustRun(t, a, "root", "cat /proc/self/"+f))
			if strings.Join(got, " ") != "0 100000 65536" {
				t.Errorf("SECURITY: sandbox %s: /proc/self/%s is %v, want 0 100000 65536", a, f, got)
			}
		}
		// From the host: the sandbox's PID 1 (root inside) runs as 100000.
		pid := sandboxPid(t, a)
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			t.Fatal(err)
		}
		if uid := strings.Fields(statusField(string(st), "Uid")); len(uid) != 4 || uid[0] != "100000" || uid[1] != "100000" {
			t.Errorf("SECURITY: sandbox %s's PID 1 runs as host uid %v, want 100000", a, uid)
		}
		mustFail(t, a, "root", "make a user namespace", "unshare -U true")
		mustFail(t, a, "root", "become root in a new user namespace", "unshare -r true")
		mustFail(t, a, "root", "make a mount namespace", "unshare -m true")
		if ok, out := attempt(t, a, "root", "unshare -Urm sh -c 'mount -t tmpfs none /mnt && echo NESTED-MOUNT'"); ok || strings.Contains(out, "NESTED-MOUNT") {
			t.Errorf("SECURITY: sandbox %s gained CAP_SYS_ADMIN in a nested user namespace: %s", a, out)
		}
		mustFail(t, a, "user", "unshare as the user", "unshare -r true")
		mustFail(t, a, "user", "sudo (setuid under no_new_privs)", "sudo -n id -u")
		if ok, out := attempt(t, a, "user", "test \"$(id -u)\" = 0"); ok {
			t.Errorf("the default user is root: %s", out)
		}
	})

	t.Run("HostIsUnreachableOverTheNetwork", func(t *testing.T) {
		// A host listener on every address, to try to reach from inside.
		ln, err := net.Listen("tcp", ":0")
		if err != nil {
			t.Fatal(err)
		}
		var hits atomic.Int64
		hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			hits.Add(1)
			w.Write([]byte("host-listener\n"))
		})}
		go hs.Serve(ln)
		defer hs.Close()
		port := ln.Addr().(*net.TCPAddr).Port
		// Positive control from the host.
		if r := do(t, "GET", fmt.Sprintf("http://127.0.0.1:%d/", port), nil, nil); r.Status != 200 {
			t.Fatalf("host listener: %s", r)
		}
		hits.Store(0)

		targets := []string{
			"http://127.0.0.1:14000/health", "http://127.0.0.1:14002/", "http://localhost:14000/health",
			fmt.Sprintf("http://127.0.0.1:%d/", port),
		}
		// Every host address, the bridge's gateway (if sandboxes have a
		// network) included.
		addrs, _ := net.InterfaceAddrs()
		for _, ad := range addrs {
			ipn, ok := ad.(*net.IPNet)
			if !ok || ipn.IP.IsLoopback() || ipn.IP.IsLinkLocalUnicast() {
				continue
			}
			host := ipn.IP.String()
			if ipn.IP.To4() == nil {
				host = "[" + host + "]"
			}
			targets = append(targets, fmt.Sprintf("http://%s:%d/", host, port),
				fmt.Sprintf("http://%s:14000/health", host), fmt.Sprintf("http://%s:14002/", host))
		}
		for _, u := range targets {
			mustFail(t, a, "root", "reach the host over the network", "curl -g -sS -m 3 -o /dev/null "+shellQuote(u))
		}
		// The sandbox's gateway, if any, must not relay to the host's
		// loopback either (egress proxy with a Host header naming it).
		gw := strings.TrimSpace(mustRun(t, a, "root", "ip -4 route show default | awk '{print $3; exit}'"))
		if gw != "" {
			for _, gport := range []string{"80", "443", "15080", "15443", "14000", "14002"} {
				for _, host := range []string{fmt.Sprintf("127.0.0.1:%d", port), "127.0.0.1:14000", "localhost:14000", fmt.Sprintf("localhost:%d", port)} {
					out := runAs(t, a, "root", fmt.Sprintf("curl -sS -m 3 -o /dev/null -w '%%{http_code}' -H %s http://%s:%s/health; true", shellQuote("Host: "+host), gw, gport), time.Minute)
					if strings.TrimSpace(out.Stdout) == "204" {
						t.Errorf("SECURITY: sandbox %s reached nook's API through its gateway %s:%s with Host %s", a, gw, gport, host)
					}
				}
			}
		}
		if n := hits.Load(); n != 0 {
			t.Errorf("SECURITY: the host listener on port %d was reached %d times from sandbox %s", port, n, a)
		}
		// The host's listening sockets (nook's API, 14000 = 0x36B0) are not
		// in the sandbox's socket tables.
		if out := mustRun(t, a, "root", "grep -i ':36B0 ' /proc/net/tcp /proc/net/tcp6; true"); strings.TrimSpace(out) != "" {
			t.Errorf("SECURITY: sandbox %s sees the host's sockets: %s", a, out)
		}
		// The README's promise when nook runs without sandbox networking:
		// loopback only.
		links := strings.Fields(mustRun(t, a, "root", "ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1"))
		if gw == "" && (len(links) != 1 || links[0] != "lo") {
			t.Errorf("SECURITY: sandbox %s has network interfaces beyond loopback but no gateway: %v", a, links)
		}
		t.Logf("sandbox %s interfaces %v, gateway %q", a, links, gw)
	})

	t.Run("SandboxesCannotReachEachOther", func(t *testing.T) {
		ipOf := func(id string) string {
			return strings.TrimSpace(mustRun(t, id, "root", "ip -4 -o addr show scope global | awk '{print $4; exit}' | cut -d/ -f1"))
		}
		ipB := ipOf(b)
		mustRun(t, b, "user", "nohup python3 -m http.server 8099 --bind 0.0.0.0 >/dev/null 2>&1 &")
		// Positive control: B's server answers on loopback (and on its own
		// address, if it has one).
		up := false
		for i := 0; i < 50 && !up; i++ {
			up = runAs(t, b, "user", "curl -sS -m 3 -o /dev/null http://127.0.0.1:8099/", time.Minute).Code == 0
			if !up {
				time.Sleep(200 * time.Millisecond)
			}
		}
		if !up {
			t.Fatalf("sandbox %s: its HTTP server on 8099 never answered", b)
		}
		if ipB == "" {
			t.Logf("sandboxes have no network address (loopback only); %s's loopback is its own", b)
			mustFail(t, a, "root", "reach another sandbox's loopback server", "curl -sS -m 3 -o /dev/null http://127.0.0.1:8099/")
			return
		}
		if r := runAs(t, b, "user", "curl -sS -m 3 -o /dev/null http://"+ipB+":8099/", time.Minute); r.Code != 0 {
			t.Logf("sandbox %s cannot reach its own address %s: %s", b, ipB, r)
		}
		mustFail(t, a, "root", "reach another sandbox over the bridge", "curl -sS -m 3 -o /dev/null http://"+ipB+":8099/")
		mustFail(t, a, "user", "reach another sandbox over the bridge", "curl -sS -m 3 -o /dev/null http://"+ipB+":8099/")
		mustFail(t, a, "root", "reach the metadata range", "curl -sS -m 3 -o /dev/null http://169.254.169.254/")
	})
}

// statusField returns the value of key in /proc/PID/status text.
func statusField(status, key string) string {
	for _, l := range strings.Split(status, "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && k == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func fileHash(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// findHostProcess returns the host pid of a process of sandbox id whose
// NUL-separated command line starts with cmdline (0 if none).
func findHostProcess(t testing.TB, id, cmdline string) int {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		cl, err := os.ReadFile(filepath.Join(p, "cmdline"))
		if err != nil || !strings.HasPrefix(string(cl), cmdline) {
			continue
		}
		cg, err := os.ReadFile(filepath.Join(p, "cgroup"))
		if err != nil || !strings.Contains(string(cg), "/nook/"+id) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(p))
		return pid
	}
	return 0
}

// TestAgentSocketSymlinkIsNotFollowed: the agent's run dir is a host
// directory bind-mounted read-write into the sandbox, and nook serve (host
// root) dials the agent's socket by its host path. Root inside the sandbox
// may replace the socket with a symlink; nook must not follow it to a host
// socket (e.g. /var/run/docker.sock), or anyone who can reach the proxy can
// talk to any host unix socket as root.
func TestAgentSocketSymlinkIsNotFollowed(t *testing.T) {
	id := createSandbox(t)
	dir, err := os.MkdirTemp("", "nook-host-socket-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "host.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var hits atomic.Int64
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Write([]byte("host-socket-reached\n"))
	})}
	go hs.Serve(ln)
	defer hs.Close()

	mustRun(t, id, "root", "rm -f /.nook/run/agent.sock && ln -s "+shellQuote(sock)+" /.nook/run/agent.sock && test -L /.nook/run/agent.sock")
	// New dials to the agent: the tunnel to a sandbox port dials for every
	// request; envd requests dial when no idle connection is left.
	var leaked []string
	for i := 0; i < 5; i++ {
		for _, hdr := range []map[string]string{
			{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "8080"},
			{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": envdPort},
			{"Host": "8080-" + id + ".example.test"},
		} {
			r, err := doErr("GET", proxyURL+"/containers/json", nil, hdr)
			if err == nil && strings.Contains(string(r.Body), "host-socket-reached") {
				leaked = append(leaked, fmt.Sprintf("%v -> %s", hdr, r))
			}
		}
	}
	if n := hits.Load(); n > 0 || len(leaked) > 0 {
		t.Errorf("SECURITY: after root in sandbox %s replaced /.nook/run/agent.sock with a symlink to the host socket %s, "+
			"unauthenticated requests to the proxy reached that host socket %d times (nook serve follows the symlink on the host); answers: %v",
			id, sock, n, leaked)
	}
	// Killing the sandbox still cleans everything up.
	killSandbox(t, id)
	requireNoLeftovers(t, id)
	if _, err := os.Stat(sock); err != nil {
		t.Errorf("the host socket %s is gone after the sandbox was killed: %v", sock, err)
	}
}

// TestConsoleLogSymlinkIsNotFollowedOnResume: PID 1's output goes to
// console.log in the sandbox's run dir, a host directory that root inside
// the sandbox can write. When nook (host root) opens that file again — on
// resume after a pause — it must not follow a symlink the sandbox put
// there, or a sandbox can create or append to any host file as root (with
// its start command's output: arbitrary content for a custom template).
func TestConsoleLogSymlinkIsNotFollowedOnResume(t *testing.T) {
	id := createSandbox(t)
	target := filepath.Join(t.TempDir(), "created-by-nook")
	mustRun(t, id, "root", "rm -f /.nook/run/console.log && ln -s "+shellQuote(target)+" /.nook/run/console.log && test -L /.nook/run/console.log")
	r := api(t, "POST", "/sandboxes/"+id+"/pause", nil)
	if r.Status == http.StatusNotFound || r.Status == http.StatusMethodNotAllowed {
		if !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
			t.Fatalf("this nook has no pause: %s", r)
		}
	}
	if r.Status != http.StatusNoContent && r.Status != http.StatusOK {
		t.Fatalf("POST /sandboxes/%s/pause: %s", id, r)
	}
	r = api(t, "POST", "/sandboxes/"+id+"/resume", []byte(`{"timeout":300}`))
	if r.Status != http.StatusCreated && r.Status != http.StatusOK {
		r = api(t, "POST", "/sandboxes/"+id+"/connect", []byte(`{"timeout":300}`))
	}
	if r.Status != http.StatusCreated && r.Status != http.StatusOK {
		t.Fatalf("resume sandbox %s: %s", id, r)
	}
	if data, err := os.ReadFile(target); err == nil {
		t.Errorf("SECURITY: after root in sandbox %s replaced /.nook/run/console.log with a symlink to the host path %s, "+
			"pause and resume made nook serve (host root) create that host file and write the sandbox's output into it: %q",
			id, target, clip(string(data)))
	}
	if got := strings.TrimSpace(mustRun(t, id, "user", "echo resumed")); got != "resumed" {
		t.Errorf("sandbox %s after resume: %q", id, got)
	}
	killSandbox(t, id)
	requireNoLeftovers(t, id)
}
