package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/template"
)

// fakeNet records the network config each sandbox was set up and updated
// with.
type fakeNet struct {
	mu     sync.Mutex
	setups map[string]NetworkConfig // as set up
	cur    map[string]NetworkConfig // current (after updates)
}

func newFakeNet() *fakeNet {
	return &fakeNet{setups: map[string]NetworkConfig{}, cur: map[string]NetworkConfig{}}
}

func (f *fakeNet) Setup(_ context.Context, id string, cfg NetworkConfig) (NetworkSetup, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.setups[id], f.cur[id] = cfg, cfg
	return NetworkSetup{}, nil
}

func (f *fakeNet) Teardown(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.cur, id)
	return nil
}

func (f *fakeNet) Check(cfg NetworkConfig) error {
	for _, e := range append(append([]string{}, cfg.AllowOut...), cfg.DenyOut...) {
		if strings.Contains(e, " ") {
			return fmt.Errorf("bad entry %q: %w", e, errdefs.ErrInvalid)
		}
	}
	return nil
}

func (f *fakeNet) Update(_ context.Context, id string, cfg NetworkConfig) error {
	if err := f.Check(cfg); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.cur[id]; !ok {
		return fmt.Errorf("no network: %w", errdefs.ErrNotFound)
	}
	f.cur[id] = cfg
	return nil
}

func (f *fakeNet) Current(id string) (NetworkConfig, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.cur[id]
	return c, ok
}

func (f *fakeNet) setup(id string) NetworkConfig {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.setups[id]
}

func js(v any) string { b, _ := json.Marshal(v); return string(b) }

// lockedTemplate adds a template whose sandboxes default to no internet
// except 10.1.0.0/16, and never 10.1.2.0/24.
func lockedTemplate(t *testing.T, m *Manager) {
	t.Helper()
	off := false
	base, err := m.cfg.Templates.Get("base")
	if err != nil {
		t.Fatal(err)
	}
	base.ID = "locked"
	base.NetworkDefaults = template.NetworkDefaults{AllowInternetAccess: &off, AllowOut: []string{"10.1.0.0/16"}, DenyOut: []string{"10.1.2.0/24"}}
	if err := m.cfg.Templates.Put(base); err != nil {
		t.Fatal(err)
	}
}

func TestWithTemplateNetworkPerField(t *testing.T) {
	off, on := false, true
	tpl := template.Template{NetworkDefaults: template.NetworkDefaults{AllowInternetAccess: &off, AllowOut: []string{"10.1.0.0/16"}, DenyOut: []string{"10.1.2.0/24"}}}
	for _, c := range []struct {
		name      string
		in, want  NetworkConfig
		zeroInput bool
	}{
		{"nothing given: the template's", NetworkConfig{},
			NetworkConfig{AllowInternet: &off, AllowOut: []string{"10.1.0.0/16"}, DenyOut: []string{"10.1.2.0/24"}}, true},
		{"internet given", NetworkConfig{AllowInternet: &on},
			NetworkConfig{AllowInternet: &on, AllowOut: []string{"10.1.0.0/16"}, DenyOut: []string{"10.1.2.0/24"}}, false},
		{"allowOut given", NetworkConfig{AllowOut: []string{"1.2.3.4"}},
			NetworkConfig{AllowInternet: &off, AllowOut: []string{"1.2.3.4"}, DenyOut: []string{"10.1.2.0/24"}}, false},
		{"empty denyOut given clears it", NetworkConfig{DenyOut: []string{}},
			NetworkConfig{AllowInternet: &off, AllowOut: []string{"10.1.0.0/16"}, DenyOut: []string{}}, false},
		{"other fields kept", NetworkConfig{DeniedHosts: []string{"x.test"}},
			NetworkConfig{AllowInternet: &off, AllowOut: []string{"10.1.0.0/16"}, DenyOut: []string{"10.1.2.0/24"}, DeniedHosts: []string{"x.test"}}, false},
	} {
		if got := WithTemplateNetwork(tpl, c.in); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: got %s, want %s", c.name, js(got), js(c.want))
		}
	}
	if got := WithTemplateNetwork(template.Template{}, NetworkConfig{}); !isZeroNetwork(got) {
		t.Errorf("no template defaults: got %s", js(got))
	}
}

// TestPoolBootsWithTemplateNetwork: warm sandboxes of a template with a
// default egress policy are set up with it, and a create that asks for no
// network of its own claims one; a create with its own fields boots anew
// with the template's policy overlaid field by field.
func TestPoolBootsWithTemplateNetwork(t *testing.T) {
	m, rt := newTestManager(t, 1)
	fn := newFakeNet()
	m.cfg.Network = fn
	lockedTemplate(t, m)
	if err := m.WarmPools(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 500 && m.PoolSizes()["locked"] < 1; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	m.pool.mu.Lock()
	warm := append([]booted(nil), m.pool.warm["locked"]...)
	m.pool.mu.Unlock()
	if len(warm) != 1 {
		t.Fatalf("pool of locked: %d", len(warm))
	}
	want := `{"allowInternet":false,"allowOut":["10.1.0.0/16"],"denyOut":["10.1.2.0/24"]}`
	if got := js(fn.setup(warm[0].id)); got != want {
		t.Fatalf("pooled sandbox set up with %s, want the template's %s", got, want)
	}
	rt.mu.Lock()
	starts := rt.starts
	rt.mu.Unlock()

	sb, err := m.Create(context.Background(), CreateOptions{Template: "locked"})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != warm[0].id {
		t.Fatalf("a create asking for nothing special did not claim the warm sandbox")
	}
	if sb.Network == nil || js(*sb.Network) != want {
		t.Fatalf("record's network %s, want %s", js(sb.Network), want)
	}

	on := true
	sb2, err := m.Create(context.Background(), CreateOptions{Template: "locked", Network: NetworkConfig{AllowInternet: &on, DenyOut: []string{}}})
	if err != nil {
		t.Fatal(err)
	}
	if sb2.ID == warm[0].id {
		t.Fatal("a create with its own network claimed a warm sandbox")
	}
	if got := js(fn.setup(sb2.ID)); got != `{"allowInternet":true,"allowOut":["10.1.0.0/16"]}` {
		t.Fatalf("create with its own fields set up with %s", got)
	}
	rt.mu.Lock()
	if rt.starts < starts+1 {
		t.Errorf("the second create did not boot a new sandbox")
	}
	rt.mu.Unlock()

	// A template without defaults still pools and claims with the zero config.
	sb3, err := m.Create(context.Background(), CreateOptions{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if got := fn.setup(sb3.ID); !isZeroNetwork(got) || sb3.Network != nil {
		t.Fatalf("base sandbox network %s / %v", js(got), sb3.Network)
	}
}

// TestUpdateAndPatchNetwork: PUT replaces the policy and is kept in the
// record (so a resume or clone starts with it); PATCH changes the given
// fields only and keeps the secrets it never shows; bad input changes
// nothing.
func TestUpdateAndPatchNetwork(t *testing.T) {
	m, _ := newTestManager(t, 0)
	fn := newFakeNet()
	m.cfg.Network = fn
	lockedTemplate(t, m)
	ctx := context.Background()
	sb, err := m.Create(ctx, CreateOptions{Template: "locked"})
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string][]NetworkRule{"api.test": {{Transform: NetworkTransform{Headers: map[string]string{"Authorization": "Bearer s3cr3t"}}}}}
	if err := m.UpdateNetwork(ctx, sb.ID, NetworkConfig{DenyOut: []string{"10.9.0.0/16"}, Rules: rules}); err != nil {
		t.Fatal(err)
	}
	if got, _ := m.Get(sb.ID); got.Network == nil || js(got.Network.DenyOut) != `["10.9.0.0/16"]` || got.Network.AllowInternet != nil {
		t.Fatalf("PUT not kept in the record (omitted fields, template defaults included, are cleared): %s", js(got.Network))
	}
	off := false
	hosts := []string{"*.blocked.test"}
	view, err := m.PatchNetwork(ctx, sb.ID, NetworkPatch{AllowInternet: &off, DeniedHosts: &hosts})
	if err != nil {
		t.Fatal(err)
	}
	cur, _ := fn.Current(sb.ID)
	if js(cur.DenyOut) != `["10.9.0.0/16"]` || cur.AllowInternet == nil || *cur.AllowInternet || js(cur.DeniedHosts) != `["*.blocked.test"]` ||
		cur.Rules["api.test"][0].Transform.Headers["Authorization"] != "Bearer s3cr3t" {
		t.Fatalf("after PATCH the network has %s", js(cur))
	}
	if strings.Contains(js(view), "s3cr3t") || !strings.Contains(js(view), `"Authorization":"***"`) {
		t.Fatalf("PATCH answer shows %s", js(view))
	}
	if shown, err := m.NetworkOf(sb.ID); err != nil || strings.Contains(js(shown), "s3cr3t") || js(shown.DeniedHosts) != `["*.blocked.test"]` {
		t.Fatalf("NetworkOf: %s %v", js(shown), err)
	}
	bad := []string{"not a cidr"}
	if _, err := m.PatchNetwork(ctx, sb.ID, NetworkPatch{AllowOut: &bad}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("bad PATCH: %v", err)
	}
	if got, _ := m.Get(sb.ID); js(got.Network.DeniedHosts) != `["*.blocked.test"]` || got.Network.AllowOut != nil {
		t.Fatalf("a refused PATCH changed the record: %s", js(got.Network))
	}
	if _, err := m.NetworkOf("nosuch"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown sandbox: %v", err)
	}
}
