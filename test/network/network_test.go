package network

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"

	nooknet "github.com/nookhq/nook/internal/network"
)

func sandboxChains() []string {
	c, err := nftables.New()
	if err != nil {
		return []string{err.Error()}
	}
	chains, _ := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	var out []string
	for _, ch := range chains {
		if ch.Table.Name == nooknet.TableName(dataDir) && strings.HasPrefix(ch.Name, "sb_") {
			out = append(out, ch.Name)
		}
	}
	return out
}

// curl runs curl in the sandbox and returns its output (body, then the
// status line "code=N") and exit code.
func curl(t *testing.T, id, args string) (string, int) {
	t.Helper()
	return run(t, id, "curl -sS --max-time 5 -w '\\ncode=%{http_code}\\n' "+args)
}

func wantOK(t *testing.T, id, args, want string) string {
	t.Helper()
	out, code := curl(t, id, args)
	if code != 0 || !strings.Contains(out, "code=200") || !strings.Contains(out, want) {
		t.Fatalf("curl %s: exit %d, want 200 with %q:\n%s", args, code, want, out)
	}
	return out
}

// wantRefused: the kernel or the proxy refused (a curl error or a 403 from nook).
func wantRefused(t *testing.T, id, args string) string {
	t.Helper()
	start := time.Now()
	out, code := curl(t, id, args)
	if code == 0 && !strings.Contains(out, "code=403") {
		t.Fatalf("curl %s: exit 0, want refusal:\n%s", args, out)
	}
	if code == 0 && !strings.Contains(out, "refused by the sandbox's network policy") {
		t.Fatalf("curl %s: 403 not from nook:\n%s", args, out)
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("curl %s: refusal took %s (want a quick refusal, not a timeout)", args, d)
	}
	return out
}

func TestInternetOnAndOff(t *testing.T) {
	on := create(t, nil)
	wantOK(t, on, "http://allowed.test/", "hello from allowed.test")
	wantOK(t, on, "http://"+ipB+":8080/raw", "hello from "+ipB)
	wantOK(t, on, "-k https://allowed.test/", "hello from allowed.test")
	out, _ := run(t, on, "cat /etc/resolv.conf; ip -4 -o addr show eth0")
	if !strings.Contains(out, "nameserver") || !strings.Contains(out, "eth0") {
		t.Fatalf("sandbox network:\n%s", out)
	}

	off := create(t, map[string]any{"allow_internet_access": false})
	wantRefused(t, off, "http://allowed.test/")
	wantRefused(t, off, "http://"+ipA+":8080/")
	wantRefused(t, off, "-k https://"+ipA+"/")
}

func TestCIDRAllowAndDeny(t *testing.T) {
	deny := create(t, map[string]any{"network": map[string]any{"denyOut": []string{ipB + "/32"}}})
	wantOK(t, deny, "http://"+ipA+"/", "hello from "+ipA)
	wantRefused(t, deny, "http://"+ipB+"/")
	wantRefused(t, deny, "http://"+ipB+":8080/")

	allow := create(t, map[string]any{"allow_internet_access": false, "network": map[string]any{"allowOut": []string{ipA}}})
	wantOK(t, allow, "http://"+ipA+":8080/", "hello from "+ipA)
	wantOK(t, allow, "http://allowed.test/", "hello from allowed.test")
	wantRefused(t, allow, "http://"+ipB+":8080/")

	// allow wins over deny
	both := create(t, map[string]any{"network": map[string]any{"allowOut": []string{ipA}, "denyOut": []string{"0.0.0.0/0"}}})
	wantOK(t, both, "http://"+ipA+":8080/", "hello")
	wantRefused(t, both, "http://"+ipB+":8080/")
}

func TestHostGlobsHTTPAndHTTPS(t *testing.T) {
	id := create(t, map[string]any{"network": map[string]any{
		"allowOut": []string{"*.allowed.test"}, "denyOut": []string{"0.0.0.0/0"},
	}})
	wantOK(t, id, "http://www.allowed.test/", "hello from www.allowed.test")
	wantOK(t, id, "-k https://www.allowed.test/", "hello from www.allowed.test")
	wantRefused(t, id, "http://allowed.test/") // the glob needs a label
	wantRefused(t, id, "http://denied.test/")  // its address is not answered
	// With the address known anyway, the Host decides (HTTP), and the SNI
	// (HTTPS): nook answers a readable 403 over its own CA, which the
	// sandbox trusts (no -k).
	for _, args := range []string{"--resolve denied.test:80:" + ipA + " http://denied.test/",
		"--resolve denied.test:443:" + ipA + " https://denied.test/"} {
		if out := wantRefused(t, id, args); !strings.Contains(out, "code=403") {
			t.Errorf("%s: refusal not a 403 from nook:\n%s", args, out)
		}
	}
	// A forged Host/SNI cannot reach a denied address: nook resolves the
	// host itself.
	wantOK(t, id, "-H 'Host: www.allowed.test' http://"+ipB+"/", "hello from www.allowed.test via "+ipA)
	wantRefused(t, id, "http://"+ipB+":8080/") // non-web port: kernel CIDR rules

	// Native denied hosts and allowed-hosts gate, for HTTP, HTTPS and DNS.
	code, out2 := api(t, "PUT", "/v1/sandboxes/"+id+"/network", map[string]any{"deniedHosts": []string{"denied.test"}})
	if code != 204 {
		t.Fatalf("native PUT: %d %s", code, out2)
	}
	wantOK(t, id, "http://allowed.test/", "hello")
	wantRefused(t, id, "http://denied.test/")
	wantRefused(t, id, "https://denied.test/")
	if out, _ := run(t, id, "getent hosts denied.test; echo rc=$?"); !strings.Contains(out, "rc=2") {
		t.Errorf("denied host resolved:\n%s", out)
	}
	code, _ = api(t, "PUT", "/v1/sandboxes/"+id+"/network", map[string]any{"allowedHosts": []string{"allowed.test"}})
	if code != 204 {
		t.Fatal(code)
	}
	wantOK(t, id, "http://allowed.test/", "hello")
	wantRefused(t, id, "http://plain.test/")
	wantRefused(t, id, "http://"+ipA+":8080/") // no host: the gate refuses
}

func TestLivePolicyChange(t *testing.T) {
	id := create(t, nil)
	wantOK(t, id, "http://denied.test/", "hello")
	setNetwork(t, id, "/network", map[string]any{"denyOut": []string{ipB + "/32"}})
	wantRefused(t, id, "http://denied.test/")
	wantRefused(t, id, "http://"+ipB+":8080/")
	setNetwork(t, id, "/network", map[string]any{"allow_internet_access": false})
	wantRefused(t, id, "http://allowed.test/")
	setNetwork(t, id, "/network", map[string]any{}) // omitted fields are cleared
	wantOK(t, id, "http://denied.test/", "hello")
	wantOK(t, id, "http://"+ipB+":8080/", "hello")
	// bad input: 400, policy unchanged
	if code, _ := api(t, "PUT", "/sandboxes/"+id+"/network", map[string]any{"allowOut": []string{"bad host"}}); code != 400 {
		t.Errorf("bad allowOut: %d", code)
	}
	if code, _ := api(t, "PUT", "/sandboxes/nosuchsandbox/network", map[string]any{}); code != 404 {
		t.Errorf("unknown sandbox: %d", code)
	}
	wantOK(t, id, "http://denied.test/", "hello")
}

func TestHeaderInjectionKeepsSecretOutside(t *testing.T) {
	const secret = "sk-nook-test-7f3a9c21e5"
	id := create(t, map[string]any{"network": map[string]any{
		"rules": map[string]any{"secret.test": []any{map[string]any{"transform": map[string]any{
			"headers": map[string]string{"Authorization": "Bearer " + secret, "X-Team": "blue"}}}}},
	}})
	for _, url := range []string{"https://secret.test/echo", "http://secret.test/echo"} {
		seenMu.Lock()
		delete(seen, "secret.test")
		seenMu.Unlock()
		// HTTPS is intercepted with nook's CA, trusted in the sandbox (no -k).
		out := wantOK(t, id, "-H 'Authorization: mine' "+url, "hello from secret.test")
		seenMu.Lock()
		got := seen["secret.test"]
		seenMu.Unlock()
		if got.Get("Authorization") != "Bearer "+secret || got.Get("X-Team") != "blue" {
			t.Fatalf("%s: server got headers %v", url, got)
		}
		if strings.Contains(out, secret) {
			t.Fatalf("%s: the response in the sandbox contains the secret:\n%s", url, out)
		}
		if !strings.Contains(out, "Authorization: *****") {
			t.Errorf("%s: echoed header not masked:\n%s", url, out)
		}
	}
	// Other hosts get no injected header.
	wantOK(t, id, "http://allowed.test/", "hello")
	seenMu.Lock()
	if h := seen["allowed.test"].Get("Authorization"); h != "" {
		t.Errorf("allowed.test got Authorization %q", h)
	}
	seenMu.Unlock()
	out, _ := run(t, id, "env; grep -rIl '"+secret+"' /etc /home /root /tmp /var /.nook /usr/local 2>/dev/null; echo done")
	if strings.Contains(out, secret) || !strings.Contains(out, "done") {
		t.Fatalf("secret visible inside the sandbox:\n%s", out)
	}
	_, detail := api(t, "GET", "/sandboxes/"+id, nil)
	if strings.Contains(string(detail), secret) {
		t.Fatal("API shows the secret")
	}
}

func TestHandlerURL(t *testing.T) {
	id := create(t, nil)
	code, out := api(t, "PUT", "/v1/sandboxes/"+id+"/network", map[string]any{
		"handlers": map[string]string{"api.test": handlerURL}})
	if code != 204 {
		t.Fatalf("%d %s", code, out)
	}
	// api.test has no address anywhere: nook's resolver sends it to the proxy.
	wantOK(t, id, "http://api.test/v1/x", "handled api.test /v1/x by "+id)
	wantOK(t, id, "https://api.test/v2", "handled api.test /v2")
	wantOK(t, id, "http://allowed.test/", "hello from allowed.test")
}

func TestNoBypassWithOwnDNSOrProxy(t *testing.T) {
	id := create(t, nil)
	code, out := api(t, "PUT", "/v1/sandboxes/"+id+"/network", map[string]any{
		"allowedHosts": []string{"allowed.test"}, "deniedHosts": []string{"denied.test"}})
	if code != 204 {
		t.Fatalf("%d %s", code, out)
	}
	// Own DNS server: the query is answered by nook's resolver anyway.
	py := `import socket,struct
def q(name):
    s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.settimeout(3)
    pkt=struct.pack('>HHHHHH',0x1234,0x0100,1,0,0,0)+b''.join(bytes([len(p)])+p.encode() for p in name.split('.'))+b'\x00'+struct.pack('>HH',1,1)
    s.sendto(pkt,('` + ipA + `',53)); r=s.recv(512)
    rcode=r[3]&15; an=struct.unpack('>H',r[6:8])[0]
    print(name,'rcode',rcode,'answers',an, socket.inet_ntoa(r[-4:]) if an else '')
q('denied.test'); q('allowed.test')`
	out2, _ := run(t, id, "python3 -c \""+strings.ReplaceAll(py, `"`, `\"`)+"\"")
	if !strings.Contains(out2, "denied.test rcode 3") || !strings.Contains(out2, "allowed.test rcode 0 answers 1 "+ipA) || strings.Contains(out2, rogueIP) {
		t.Fatalf("own DNS server not overridden:\n%s", out2)
	}
	// Own proxy variables: a proxy on another port is refused by the
	// kernel; one on port 80 is nook's proxy anyway.
	wantRefused(t, id, "-x http://"+ipA+":8080 http://denied.test/")
	wantRefused(t, id, "-x http://"+ipA+":80 http://denied.test/")
	wantRefused(t, id, "-x http://"+ipA+":80 http://plain.test/")
	out3, _ := run(t, id, "https_proxy=http://"+ipA+":8080 curl -sS --max-time 5 -k https://denied.test/; echo rc=$?")
	if strings.Contains(out3, "rc=0") {
		t.Fatalf("proxy vars bypassed the policy:\n%s", out3)
	}
	wantOK(t, id, "http://allowed.test/", "hello")
}

func TestIsolation(t *testing.T) {
	a := create(t, nil)
	b := create(t, nil)
	run(t, a, "nohup python3 -m http.server 8000 --bind 0.0.0.0 >/dev/null 2>&1 & sleep 1")
	ipOut, _ := run(t, a, "ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1")
	ipAddr := strings.TrimSpace(ipOut)
	if net.ParseIP(ipAddr) == nil {
		t.Fatalf("sandbox address %q", ipOut)
	}
	wantOK(t, a, "http://127.0.0.1:8000/", "")
	wantRefused(t, b, "http://"+ipAddr+":8000/")

	// Host services: loopback-only and all-interfaces listeners.
	lo, _ := net.Listen("tcp4", "127.0.0.1:0")
	all, _ := net.Listen("tcp4", "0.0.0.0:0")
	defer lo.Close()
	defer all.Close()
	for _, l := range []net.Listener{lo, all} {
		go func(l net.Listener) {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				c.Write([]byte("HTTP/1.0 200 OK\r\n\r\nhost-service\n"))
				c.Close()
			}
		}(l)
	}
	gwOut, _ := run(t, b, "ip -4 route show default | awk '{print $3}'")
	gw := strings.TrimSpace(gwOut)
	allPort := strconv.Itoa(all.Addr().(*net.TCPAddr).Port)
	loPort := strconv.Itoa(lo.Addr().(*net.TCPAddr).Port)
	wantRefused(t, b, "http://"+gw+":"+allPort+"/")
	wantRefused(t, b, "http://"+gw+":16000/health") // nook's API port
	for _, ip := range hostAddrs() {
		wantRefused(t, b, "http://"+ip+":"+allPort+"/")
	}
	wantRefused(t, b, "http://169.254.169.254/")
	// Through the proxy too (host rules on): names of loopback/metadata.
	setNetwork(t, b, "/network", map[string]any{"allowOut": []string{"*.allowed.test"}})
	wantRefused(t, b, "http://hostloop.test:"+loPort+"/")
	wantRefused(t, b, "http://hostloop.test/")
	wantRefused(t, b, "http://metadata.test/")
	wantRefused(t, b, "-H 'Host: "+ipAddr+"' http://"+ipAddr+":80/")
}

func hostAddrs() []string {
	var out []string
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
			out = append(out, ipn.IP.String())
		}
	}
	return out
}

// TestProxiedLatency measures a request through the transparent proxy
// against the same request straight through the kernel, in one run.
func TestProxiedLatency(t *testing.T) {
	id := create(t, nil)
	script := `python3 - <<'EOF'
import http.client,time
def bench(n=200):
    ts=[]
    for i in range(n):
        t=time.perf_counter(); c=http.client.HTTPConnection('allowed.test',80,timeout=5); c.request('GET','/'); c.getresponse().read(); c.close(); ts.append(time.perf_counter()-t)
    ts.sort(); return ts[len(ts)//2]*1e3, ts[int(len(ts)*0.95)]*1e3
print('median=%.3f p95=%.3f' % bench())
EOF`
	direct, _ := run(t, id, script)
	setNetwork(t, id, "/network", map[string]any{"allowOut": []string{"*.allowed.test"}}) // host rules: port 80 via the proxy
	proxied, _ := run(t, id, script)
	t.Logf("new connection + GET, direct (kernel NAT): %s", strings.TrimSpace(direct))
	t.Logf("new connection + GET, through nook's proxy: %s", strings.TrimSpace(proxied))
}

// TestCleanupAfterKill: nook serve is killed, the sandbox ends while it is
// down, and the next start removes its veth, namespace, rules and state.
func TestCleanupAfterKill(t *testing.T) {
	code, out := api(t, "POST", "/sandboxes", map[string]any{"templateID": "base", "timeout": 300})
	if code != 201 {
		t.Fatalf("%d %s", code, out)
	}
	id := strings.Split(strings.Split(string(out), `"sandboxID":"`)[1], `"`)[0]
	veth := "nk" + id[len(id)-12:]
	if _, err := net.InterfaceByName(veth); err != nil {
		t.Fatalf("veth %s: %v", veth, err)
	}
	srv.Kill()
	time.Sleep(500 * time.Millisecond)
	if o, err := exec.Command("runc", "--root", filepath.Join(dataDir, "runc"), "delete", "--force", id).CombinedOutput(); err != nil {
		t.Fatalf("runc delete: %v %s", err, o)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := net.InterfaceByName(veth); err == nil {
		t.Errorf("veth %s left after restart", veth)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "network", "netns", id)); err == nil {
		t.Error("netns left")
	}
	for _, ch := range sandboxChains() {
		if ch == "sb_"+id {
			t.Error("nft chain left")
		}
	}
	// And a sandbox made after the restart works.
	id2 := create(t, nil)
	wantOK(t, id2, "http://allowed.test/", "hello")
	fmt.Fprint(os.Stderr)
}

// TestExposedPortThroughProxy: an HTTP server in a networked sandbox is
// reachable through nook's sandbox-traffic proxy; a closed port is a quick 502.
func TestExposedPortThroughProxy(t *testing.T) {
	id := create(t, nil)
	run(t, id, "mkdir -p /tmp/www && echo exposed-ok > /tmp/www/index.html && cd /tmp/www && (nohup python3 -m http.server 8000 >/dev/null 2>&1 &) ; sleep 1")
	get := func(port string) (int, string) {
		req, _ := http.NewRequest("GET", "http://"+proxyAddr+"/", nil)
		req.Header.Set("E2b-Sandbox-Id", id)
		req.Header.Set("E2b-Sandbox-Port", port)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("8000"); code != 200 || !strings.Contains(body, "exposed-ok") {
		t.Fatalf("port 8000: %d %s", code, body)
	}
	start := time.Now()
	if code, _ := get("8001"); code != 502 || time.Since(start) > 2*time.Second {
		t.Fatalf("closed port: %d after %s", code, time.Since(start))
	}
}

// TestSpareNamespacesServeOneSandboxEach: the namespaces nook makes ahead
// of time are each given to one sandbox only, and are refilled.
func TestSpareNamespacesServeOneSandboxEach(t *testing.T) {
	spares := func() []string {
		entries, _ := os.ReadDir(filepath.Join(dataDir, "network", "netns"))
		var out []string
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "spare-") {
				out = append(out, e.Name())
			}
		}
		return out
	}
	seen := map[string]string{}
	for i := 0; i < 6; i++ { // more than the spares kept
		id := create(t, nil)
		ns, code := run(t, id, "readlink /proc/self/ns/net")
		if code != 0 {
			t.Fatalf("readlink: %s", ns)
		}
		ns = strings.TrimSpace(ns)
		if other, ok := seen[ns]; ok {
			t.Fatalf("SECURITY: sandboxes %s and %s share network namespace %s", other, id, ns)
		}
		seen[ns] = id
		wantOK(t, id, "http://allowed.test/", "hello")
	}
	for i := 0; i < 100 && len(spares()) < 4; i++ {
		time.Sleep(50 * time.Millisecond)
	}
	if n := len(spares()); n != 4 {
		t.Errorf("%d spare namespaces after the refill, want 4", n)
	}
}

// TestKeptTunnelsStayWithTheirSandbox: the proxy keeps idle tunnels to
// sandbox ports; requests alternating between two sandboxes serving the
// same port each reach their own sandbox, over kept connections too.
func TestKeptTunnelsStayWithTheirSandbox(t *testing.T) {
	ids := []string{create(t, nil), create(t, nil)}
	for _, id := range ids {
		run(t, id, "mkdir -p /tmp/www && echo "+id+" > /tmp/www/index.html && cd /tmp/www && (nohup python3 -m http.server 8100 >/dev/null 2>&1 &) ; sleep 1")
	}
	for i := 0; i < 20; i++ {
		id := ids[i%2]
		req, _ := http.NewRequest("GET", "http://"+proxyAddr+"/", nil)
		req.Header.Set("E2b-Sandbox-Id", id)
		req.Header.Set("E2b-Sandbox-Port", "8100")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || strings.TrimSpace(string(b)) != id {
			t.Fatalf("SECURITY: request %d for sandbox %s answered %d %q", i, id, resp.StatusCode, b)
		}
	}
}
