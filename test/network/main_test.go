// Package network tests sandbox networking end to end: it builds nook,
// starts `nook serve` (data dir /var/lib/nook-test-net, API 127.0.0.1:16000,
// proxy 127.0.0.1:16002) and a fake "internet": a network namespace the test
// creates with servers on 198.18.0.2 and 198.18.0.3 (HTTP, HTTPS with a test
// CA, a raw port, a rogue DNS server). No traffic leaves this machine.
//
//	cd /work/main && go test -count=1 -v ./test/network/
package network

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netns"

	nooknet "github.com/nookhq/nook/internal/network"
	"github.com/nookhq/nook/test/testenv"
)

const (
	apiAddr   = "127.0.0.1:16000"
	proxyAddr = "127.0.0.1:16002"
	apiURL    = "http://" + apiAddr
	apiKey    = "nook-network-test-key"
	dataDir   = "/var/lib/nook-test-net"
	inetNS    = "nooktest-inet"
	inetHost  = "nktinet0"
	ipA       = "198.18.0.2" // "the internet", first address
	ipB       = "198.18.0.3" // second address (for CIDR rules)
	rogueIP   = "198.18.0.99"
)

var (
	binDir, nookBin string
	srv             *testenv.Server
	hostsFile       string
	caFile          string
	handlerURL      string
	// seen records the last request headers each fake-internet host got.
	seenMu sync.Mutex
	seen   = map[string]http.Header{}
)

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "FAIL: network tests need root")
		return 1
	}
	var err error
	binDir, err = os.MkdirTemp("", "nook-net-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	defer os.RemoveAll(binDir)
	root, err := testenv.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	bins, err := testenv.Build(root, binDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	nookBin = bins.Nook
	cleanupInternet()
	defer cleanupInternet()
	if err := startInternet(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: fake internet:", err)
		return 1
	}
	hl, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	handlerURL = "http://" + hl.Addr().String()
	go http.Serve(hl, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "handled %s %s by %s", r.Header.Get("X-Forwarded-Host"), r.URL.Path, r.Header.Get("X-Nook-Sandbox-Id"))
	}))
	srv = &testenv.Server{
		Bin: nookBin, DataDir: dataDir, APIAddr: apiAddr, ProxyAddr: proxyAddr, APIKey: apiKey,
		Flags: []string{"--pool-size", "0",
			"--network-hosts-file", hostsFile, "--network-dns", ipA + ":53", "--network-upstream-ca", caFile},
		Env:     testenv.RootfsCacheEnv(),
		LogPath: filepath.Join(binDir, "serve.log"),
		Timeout: 20 * time.Minute,
	}
	if err := srv.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: nook serve:", err)
		dumpLog()
		srv.Stop()
		return 1
	}
	code := m.Run()
	if err := killAll(); err != nil {
		fmt.Fprintln(os.Stderr, "cleanup:", err)
		code = 1
	}
	if err := checkNoLeftovers(); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: leftovers after every sandbox ended:", err)
		code = 1
	}
	if code != 0 {
		dumpLog()
	}
	srv.Stop()
	// nook's spare namespaces (made ahead of time, no sandbox's) go with it.
	for _, d := range []string{"network/netns", "network/userns"} {
		entries, _ := os.ReadDir(filepath.Join(dataDir, d))
		for _, e := range entries {
			fmt.Fprintf(os.Stderr, "FAIL: %s/%s left after nook serve stopped\n", d, e.Name())
			code = 1
		}
	}
	if err := nooknet.Remove(dataDir); err != nil {
		fmt.Fprintln(os.Stderr, "remove instance network:", err)
	}
	return code
}

func dumpLog() {
	fmt.Fprintln(os.Stderr, "--- nook serve log (tail) ---\n"+srv.LogTail(80))
}

// --- the fake internet ---

func sh(args ...string) error {
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

func cleanupInternet() {
	exec.Command("ip", "link", "del", inetHost).Run()
	exec.Command("ip", "netns", "del", inetNS).Run()
}

// listenIn opens a listener inside the fake internet's namespace.
func listenIn(network, addr string) (net.Listener, net.PacketConn, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return nil, nil, err
	}
	defer orig.Close()
	ns, err := netns.GetFromName(inetNS)
	if err != nil {
		return nil, nil, err
	}
	defer ns.Close()
	if err := netns.Set(ns); err != nil {
		return nil, nil, err
	}
	defer netns.Set(orig)
	if network == "udp4" {
		pc, err := net.ListenPacket(network, addr)
		return nil, pc, err
	}
	l, err := net.Listen(network, addr)
	return l, nil, err
}

func startInternet() error {
	for _, c := range [][]string{
		{"ip", "netns", "add", inetNS},
		{"ip", "link", "add", inetHost, "type", "veth", "peer", "name", "eth0", "netns", inetNS},
		{"ip", "addr", "add", "198.18.0.1/24", "dev", inetHost},
		{"ip", "link", "set", inetHost, "up"},
		{"ip", "-n", inetNS, "addr", "add", ipA + "/24", "dev", "eth0"},
		{"ip", "-n", inetNS, "addr", "add", ipB + "/24", "dev", "eth0"},
		{"ip", "-n", inetNS, "link", "set", "eth0", "up"},
		{"ip", "-n", inetNS, "link", "set", "lo", "up"},
		{"ip", "-n", inetNS, "route", "add", "default", "via", "198.18.0.1"},
	} {
		if err := sh(c...); err != nil {
			return err
		}
	}
	certPEM, cert, err := testCA()
	if err != nil {
		return err
	}
	caFile = filepath.Join(binDir, "internet-ca.pem")
	hostsFile = filepath.Join(binDir, "hosts")
	os.WriteFile(caFile, certPEM, 0o644)
	os.WriteFile(hostsFile, []byte(strings.Join([]string{
		ipA + " allowed.test www.allowed.test secret.test plain.test",
		ipB + " denied.test other.test",
		"127.0.0.1 hostloop.test",
		"169.254.169.254 metadata.test",
	}, "\n")+"\n"), 0o644)
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := strings.Split(r.Host, ":")[0]
		seenMu.Lock()
		seen[host] = r.Header.Clone()
		seenMu.Unlock()
		local := r.Context().Value(http.LocalAddrContextKey).(net.Addr).String()
		fmt.Fprintf(w, "hello from %s via %s path %s\n", host, local, r.URL.Path)
		keys := make([]string, 0, len(r.Header))
		for k := range r.Header {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "%s: %s\n", k, strings.Join(r.Header[k], ","))
		}
	})
	for _, ip := range []string{ipA, ipB} {
		for _, port := range []string{"80", "443", "8080"} {
			l, _, err := listenIn("tcp4", ip+":"+port)
			if err != nil {
				return err
			}
			if port == "443" {
				l = tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{cert}})
			}
			go http.Serve(l, echo)
		}
	}
	// A rogue DNS server: answers every name with rogueIP.
	_, pc, err := listenIn("udp4", ipA+":53")
	if err != nil {
		return err
	}
	go (&dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		r := new(dns.Msg)
		r.SetReply(q)
		if q.Question[0].Qtype == dns.TypeA {
			r.Answer = append(r.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: net.ParseIP(rogueIP)})
		}
		w.WriteMsg(r)
	})}).ActivateAndServe()
	return nil
}

// testCA makes the fake internet's CA and a server certificate for every
// test name signed by it.
func testCA() ([]byte, tls.Certificate, error) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fake internet CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	caCert, _ := x509.ParseCertificate(der)
	skey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	stpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "fake internet"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		DNSNames:    []string{"allowed.test", "www.allowed.test", "secret.test", "denied.test", "other.test", "plain.test"},
		IPAddresses: []net.IP{net.ParseIP(ipA), net.ParseIP(ipB)},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	sder, err := x509.CreateCertificate(rand.Reader, stpl, caCert, &skey.PublicKey, key)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		tls.Certificate{Certificate: [][]byte{sder, der}, PrivateKey: skey}, nil
}

// --- the API and sandboxes ---

func api(t testing.TB, method, path string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, apiURL+path, rd)
	req.Header.Set("X-API-Key", apiKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// create makes a sandbox with the given E2B create-body fields.
func create(t testing.TB, fields map[string]any) string {
	t.Helper()
	body := map[string]any{"templateID": "base", "timeout": 300}
	for k, v := range fields {
		body[k] = v
	}
	code, out := api(t, "POST", "/sandboxes", body)
	if code != 201 {
		t.Fatalf("create: %d %s", code, out)
	}
	var sb struct {
		SandboxID string `json:"sandboxID"`
	}
	json.Unmarshal(out, &sb)
	t.Cleanup(func() { api(t, "DELETE", "/sandboxes/"+sb.SandboxID, nil) })
	return sb.SandboxID
}

func setNetwork(t testing.TB, id, path string, body any) {
	t.Helper()
	code, out := api(t, "PUT", "/sandboxes/"+id+path, body)
	if code != 204 {
		t.Fatalf("PUT network: %d %s", code, out)
	}
}

// run runs a bash command in the sandbox through the nook CLI.
func run(t testing.TB, id, script string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, nookBin, "sandbox", "run", "--api-url", apiURL, "--api-key", apiKey,
		"--sandbox-url", "http://"+proxyAddr, id, "--", script)
	out, err := cmd.CombinedOutput()
	code := 0
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else {
			t.Fatalf("run %q: %v", script, err)
		}
	}
	return string(out), code
}

func killAll() error {
	code, out := api(&testing.B{}, "GET", "/sandboxes", nil)
	if code != 200 {
		return fmt.Errorf("list: %d", code)
	}
	var list []struct {
		SandboxID string `json:"sandboxID"`
	}
	json.Unmarshal(out, &list)
	for _, sb := range list {
		api(&testing.B{}, "DELETE", "/sandboxes/"+sb.SandboxID, nil)
	}
	return nil
}

// checkNoLeftovers: no veth on the instance's bridge, no pinned namespace
// but nook's spares (made ahead of time, holding nothing of a sandbox), no
// per-sandbox chain, no state file.
func checkNoLeftovers() error {
	var problems []string
	out, _ := exec.Command("ip", "-o", "link", "show", "master", nooknet.BridgeName(dataDir)).CombinedOutput()
	if s := strings.TrimSpace(string(out)); s != "" {
		problems = append(problems, "veths: "+s)
	}
	for _, d := range []string{"network/netns", "network/sandboxes"} {
		entries, _ := os.ReadDir(filepath.Join(dataDir, d))
		for _, e := range entries {
			if d == "network/netns" && strings.HasPrefix(e.Name(), "spare-") {
				continue
			}
			problems = append(problems, d+"/"+e.Name())
		}
	}
	if chains := sandboxChains(); len(chains) > 0 {
		problems = append(problems, "nft chains: "+strings.Join(chains, ","))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}
