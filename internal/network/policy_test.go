package network

import (
	"io"
	"net/netip"
	"reflect"
	"sort"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/nookhq/nook/internal/sandbox"
)

func bp(b bool) *bool { return &b }

func TestEvaluateOrder(t *testing.T) {
	blocked := func(a netip.Addr) bool { return a.IsLoopback() || a.IsLinkLocalUnicast() }
	pub := netip.MustParseAddr("198.18.0.2")
	other := netip.MustParseAddr("198.18.0.3")
	cases := []struct {
		name  string
		cfg   sandbox.NetworkConfig
		host  string
		addr  netip.Addr
		allow bool
		rule  string
	}{
		{"default internet", sandbox.NetworkConfig{}, "a.test", pub, true, "internet"},
		{"internet off", sandbox.NetworkConfig{AllowInternet: bp(false)}, "a.test", pub, false, "internet access disabled"},
		{"allow CIDR with internet off", sandbox.NetworkConfig{AllowInternet: bp(false), AllowOut: []string{"198.18.0.0/30"}}, "", pub, true, "allowed CIDR 198.18.0.0/30"},
		{"allow IP wins over deny CIDR", sandbox.NetworkConfig{AllowOut: []string{"198.18.0.2"}, DenyOut: []string{"0.0.0.0/0"}}, "", pub, true, "allowed CIDR 198.18.0.2/32"},
		{"deny CIDR", sandbox.NetworkConfig{DenyOut: []string{"198.18.0.3/32"}}, "", other, false, "denied CIDR 198.18.0.3/32"},
		{"allow host glob wins over deny all", sandbox.NetworkConfig{AllowOut: []string{"*.allowed.test"}, DenyOut: []string{"0.0.0.0/0"}}, "www.allowed.test", pub, true, "allowed host"},
		{"glob needs a label", sandbox.NetworkConfig{AllowOut: []string{"*.allowed.test"}, AllowInternet: bp(false)}, "allowed.test", pub, false, "internet access disabled"},
		{"blocked loopback", sandbox.NetworkConfig{}, "localhost", netip.MustParseAddr("127.0.0.1"), false, "blocked address 127.0.0.1"},
		{"metadata blocked", sandbox.NetworkConfig{}, "", netip.MustParseAddr("169.254.169.254"), false, "blocked address 169.254.169.254"},
		{"explicit allow of metadata", sandbox.NetworkConfig{AllowOut: []string{"169.254.169.254"}}, "", netip.MustParseAddr("169.254.169.254"), true, "allowed CIDR 169.254.169.254/32"},
		{"denied host first", sandbox.NetworkConfig{AllowedHosts: []string{"*.test"}, DeniedHosts: []string{"bad.test"}}, "bad.test", pub, false, "denied host"},
		{"gate", sandbox.NetworkConfig{AllowedHosts: []string{"good.test"}}, "other.test", pub, false, "not in allowed hosts"},
		{"gate allows", sandbox.NetworkConfig{AllowedHosts: []string{"good.test"}, AllowInternet: bp(false)}, "good.test", pub, true, "allowed host"},
		{"handler beats gate", sandbox.NetworkConfig{AllowedHosts: []string{"good.test"}, Handlers: map[string]string{"api.test": "http://127.0.0.1:1"}}, "api.test", netip.Addr{}, true, "handler api.test"},
		{"catch-all handler", sandbox.NetworkConfig{Handlers: map[string]string{"*": "http://127.0.0.1:1"}}, "x.test", netip.Addr{}, true, "handler *"},
	}
	for _, c := range cases {
		p, err := PolicyFrom(c.cfg)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		v := p.Evaluate(c.host, c.addr, blocked)
		if v.Allow != c.allow || v.Rule != c.rule {
			t.Errorf("%s: got allow=%v rule=%q, want %v %q", c.name, v.Allow, v.Rule, c.allow, c.rule)
		}
	}
}

func TestRuleForSpecificity(t *testing.T) {
	p, err := PolicyFrom(sandbox.NetworkConfig{Rules: map[string][]sandbox.NetworkRule{
		"*.example.com":     {{Transform: sandbox.NetworkTransform{Headers: map[string]string{"X": "wild"}}}},
		"*.api.example.com": {{Transform: sandbox.NetworkTransform{Headers: map[string]string{"X": "longer"}}}},
		"API.example.com":   {{Transform: sandbox.NetworkTransform{Headers: map[string]string{"X": "exact"}}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]string{
		"api.example.com": "exact", "v1.api.example.com": "longer", "www.example.com": "wild",
	} {
		rs := p.RuleFor(host)
		if len(rs) != 1 || rs[0].Transform.Headers["X"] != want {
			t.Errorf("%s: got %v, want %s", host, rs, want)
		}
	}
	if rs := p.RuleFor("example.org"); rs != nil {
		t.Errorf("example.org matched %v", rs)
	}
	if red := p.Redacted(); strings.Contains(red.Rules["api.example.com"][0].Transform.Headers["X"], "exact") {
		t.Error("Redacted kept a secret")
	}
}

func TestBadInput(t *testing.T) {
	for _, cfg := range []sandbox.NetworkConfig{
		{AllowOut: []string{"exa mple.com"}},
		{DenyOut: []string{""}},
		{AllowOut: []string{"a.*.com"}},
		{Rules: map[string][]sandbox.NetworkRule{"x.com": {{Transform: sandbox.NetworkTransform{Headers: map[string]string{"Bad Name": "v"}}}}}},
		{Rules: map[string][]sandbox.NetworkRule{"x.com": {{Transform: sandbox.NetworkTransform{Headers: map[string]string{"X": "a\r\nInjected: 1"}}}}}},
		{Handlers: map[string]string{"x.com": "ftp://h"}},
	} {
		if _, err := PolicyFrom(cfg); err == nil {
			t.Errorf("%+v: accepted", cfg)
		}
	}
}

func TestRedactor(t *testing.T) {
	secret := "sk-live-0123456789"
	body := "before " + secret + " middle " + secret + secret + " end"
	r := &redactor{r: io.NopCloser(iotest.OneByteReader(strings.NewReader(body))), secrets: []string{secret}}
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), secret) || len(out) != len(body) {
		t.Fatalf("redacted %q", out)
	}
	if !strings.HasPrefix(string(out), "before ****") || !strings.HasSuffix(string(out), " end") {
		t.Fatalf("redacted %q", out)
	}
}

// TestPolicyConfigRoundTrip: a policy turned back into a config (for the
// CLI's GET and PATCH) makes the same policy again.
func TestPolicyConfigRoundTrip(t *testing.T) {
	cfg := sandbox.NetworkConfig{
		AllowInternet: bp(false),
		AllowOut:      []string{"198.18.0.2", "10.0.0.0/8", "*.allowed.test"},
		DenyOut:       []string{"198.18.0.3/32", "bad.test"},
		AllowedHosts:  []string{"gate.test"},
		DeniedHosts:   []string{"*.denied.test"},
		Rules:         map[string][]sandbox.NetworkRule{"api.test": {{Transform: sandbox.NetworkTransform{Headers: map[string]string{"Authorization": "Bearer x1234"}}}}},
		Handlers:      map[string]string{"h.test": "http://127.0.0.1:9/"},
	}
	p, err := PolicyFrom(cfg)
	if err != nil {
		t.Fatal(err)
	}
	back := p.Config()
	q, err := PolicyFrom(back)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(normalized(p), normalized(q)) {
		t.Fatalf("round trip changed the policy:\n%+v\n%+v", p, q)
	}
	if back.Rules["api.test"][0].Transform.Headers["Authorization"] != "Bearer x1234" {
		t.Fatal("Config dropped a rule's header value")
	}
	if *back.AllowInternet || strings.Join(back.AllowOut, " ") != "198.18.0.2/32 10.0.0.0/8 *.allowed.test" {
		t.Fatalf("config %+v", back)
	}
}

func normalized(p Policy) Policy {
	sort.Strings(p.DenyHosts)
	sort.Strings(p.AllowHosts)
	sort.Strings(p.GateHosts)
	return p
}
