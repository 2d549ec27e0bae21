package templates

import (
	"archive/tar"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	it "github.com/nookhq/nook/internal/image/imagetest"
)

// startCmd is a start command that records what the main process sees,
// then keeps running.
var startCmd = []string{"/bin/sh", "-c", `echo "$IMG $OVER $NEW $(pwd) $(id -u)" > /tmp/started; exec sleep 100000`}

// appImage is busybox plus a work dir and config that the tests check.
func appImage(t *testing.T, extra ...v1.Layer) v1.Image {
	layers := append([]v1.Layer{
		it.BusyboxLayer(t, it.DefaultApplets...),
		it.Layer(t, []it.Entry{{Name: "work/", Type: tar.TypeDir, UID: 1000, GID: 1000}, {Name: "work/marker", Body: "app"}}),
	}, extra...)
	return it.Image(t, v1.Config{
		Env:          []string{"PATH=/bin", "IMG=from-image", "OVER=from-image"},
		Cmd:          startCmd,
		WorkingDir:   "/work",
		User:         "1000",
		ExposedPorts: map[string]struct{}{"8080/tcp": {}},
	}, layers...)
}

type tplInfo struct {
	TemplateID   string   `json:"templateID"`
	BuildID      string   `json:"buildID"`
	Aliases      []string `json:"aliases"`
	State        string   `json:"state"`
	Reason       string   `json:"reason"`
	Env          []string `json:"env"`
	Cmd          []string `json:"cmd"`
	WorkingDir   string   `json:"workingDir"`
	User         string   `json:"user"`
	ExposedPorts []int    `json:"exposedPorts"`
	CPUMillis    int64    `json:"cpuMillis"`
	MemoryMB     int64    `json:"memoryMB"`
	DiskSizeMB   int64    `json:"diskSizeMB"`
	Layers       int      `json:"layers"`
}

func info(t *testing.T, id string) tplInfo {
	t.Helper()
	r := api(t, "GET", "/templates/"+id, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("GET /templates/%s: %s", id, r)
	}
	var ti tplInfo
	if err := json.Unmarshal(r.Body, &ti); err != nil {
		t.Fatal(err)
	}
	return ti
}

// createFromImage runs `nook tpl create-from-image --json` in the
// foreground and returns the template (it fails the test unless READY).
func createFromImage(t *testing.T, args ...string) tplInfo {
	t.Helper()
	out := mustNook(t, 5*time.Minute, append([]string{"tpl", "create-from-image", "--json"}, args...)...)
	var ti tplInfo
	if err := json.Unmarshal([]byte(out), &ti); err != nil {
		t.Fatalf("create-from-image --json: %v in %q", err, out)
	}
	if ti.State != "READY" {
		t.Fatalf("template %s is %s: %s", ti.TemplateID, ti.State, ti.Reason)
	}
	t.Cleanup(func() { doAPI("DELETE", "/templates/"+ti.TemplateID, nil) })
	return ti
}

func TestRegistryImageConfigAndLifecycle(t *testing.T) {
	reg := it.ServeRegistry(t, "alice", "s3cret")
	defer reg.Close()
	ref := reg.Ref(t, "apps/busybox:1")
	if err := remote.Write(ref, appImage(t), remote.WithAuth(&authn.Basic{Username: "alice", Password: "s3cret"})); err != nil {
		t.Fatal(err)
	}

	// A wrong password: the build fails with a clear reason.
	r := nook(t, 2*time.Minute, "tpl", "create-from-image", "--image", ref.String(), "--alias", "bb-badpw",
		"--registry-username", "alice", "--registry-password", "wrong")
	if r.Code == 0 || !strings.Contains(r.Stderr, "refused the credentials") {
		t.Fatalf("wrong password: %s", r)
	}
	if ti := info(t, "bb-badpw"); ti.State != "FAILED" || !strings.Contains(ti.Reason, "refused the credentials") {
		t.Fatalf("wrong password: template %+v", ti)
	}
	mustNook(t, time.Minute, "tpl", "delete", "bb-badpw")

	ti := createFromImage(t, "--image", ref.String(), "--alias", "bb", "--registry-username", "alice", "--registry-password", "s3cret",
		"--env", "OVER=from-flag", "--env", "NEW=new", "--cpu", "500", "--memory", "256", "--writable-layer-size", "64M", "--expose-port", "9000")
	if ti.WorkingDir != "/work" || ti.User != "1000" || ti.CPUMillis != 500 || ti.MemoryMB != 256 || ti.DiskSizeMB != 64 {
		t.Errorf("template config: %+v", ti)
	}
	if got := strings.Join(ti.Env, " "); got != "PATH=/bin IMG=from-image OVER=from-flag NEW=new" {
		t.Errorf("env: --env merges over the image env, replacing same names: got %q", got)
	}
	if fmt.Sprint(ti.ExposedPorts) != "[8080 9000]" || fmt.Sprint(ti.Cmd) != fmt.Sprint(startCmd) {
		t.Errorf("ports %v cmd %q", ti.ExposedPorts, ti.Cmd)
	}

	// The alias resolves, and the template is listed.
	r2 := api(t, "GET", "/templates/aliases/bb", nil)
	if r2.Status != http.StatusOK || !strings.Contains(string(r2.Body), ti.TemplateID) {
		t.Fatalf("GET /templates/aliases/bb: %s", r2)
	}
	if out := mustNook(t, time.Minute, "tpl", "list"); !strings.Contains(out, ti.TemplateID) || !strings.Contains(out, "bb") {
		t.Errorf("tpl list: %s", out)
	}
	if out := mustNook(t, time.Minute, "tpl", "status", "bb"); !strings.Contains(out, "READY") || !strings.Contains(out, "layers 2/2") {
		t.Errorf("tpl status: %s", out)
	}
	if r := api(t, "GET", "/templates/aliases/nope", nil); r.Status != http.StatusNotFound {
		t.Errorf("unknown alias: %s", r)
	}

	// The start command ran as the image's user, in its work dir, with the
	// image env merged with --env.
	id := newSandbox(t, "bb")
	var started string
	for i := 0; i < 50; i++ {
		if started = strings.TrimSpace(run(t, id, "cat /tmp/started 2>/dev/null || true")); started != "" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if started != "from-image from-flag new /work 1000" {
		t.Errorf("start command saw %q, want %q", started, "from-image from-flag new /work 1000")
	}
	if got := strings.TrimSpace(run(t, id, "cat /work/marker")); got != "app" {
		t.Errorf("/work/marker: %q", got)
	}
	// The CPU limit is enforced (500 millicores -> 50000 us per 100000 us).
	if got := run(t, id, "cat /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us"); !strings.Contains(got, "50000") {
		t.Errorf("cpu limit: %q", got)
	}

	// Deleting a template that a running sandbox uses is refused.
	r3 := api(t, "DELETE", "/templates/bb", nil)
	if r3.Status != http.StatusConflict || !strings.Contains(string(r3.Body), id) {
		t.Fatalf("delete in use: %s", r3)
	}
	if r := nook(t, time.Minute, "tpl", "delete", "bb"); r.Code == 0 || !strings.Contains(r.Stderr, "running sandbox") {
		t.Errorf("CLI delete in use: %s", r)
	}
	mustNook(t, time.Minute, "sandbox", "kill", id)
	mustNook(t, time.Minute, "tpl", "delete", "bb")
	if r := api(t, "GET", "/templates/"+ti.TemplateID, nil); r.Status != http.StatusNotFound {
		t.Errorf("after delete: %s", r)
	}
}

func TestLocalSourcesWhiteoutsAndReadyTime(t *testing.T) {
	// Layer 3 deletes a file of layer 2 and makes /opt opaque.
	lower := it.Layer(t, []it.Entry{{Name: "etc/gone", Body: "x"}, {Name: "opt/", Type: tar.TypeDir}, {Name: "opt/old", Body: "old"},
		{Name: "data/", Type: tar.TypeDir}, {Name: "data/hard1", Body: "linked"}, {Name: "data/hard2", Type: tar.TypeLink, Linkname: "data/hard1"},
		{Name: "data/link", Type: tar.TypeSymlink, Linkname: "/work/marker"}})
	upper := it.Layer(t, []it.Entry{{Name: "etc/.wh.gone"}, {Name: "opt/.wh..wh..opq"}, {Name: "opt/new", Body: "new"}})
	img := appImage(t, lower, upper)

	// A multi-arch OCI layout: the linux/amd64 image is picked.
	arm := it.Image(t, v1.Config{}, it.Layer(t, []it.Entry{{Name: "arm", Body: "arm"}}))
	cf, _ := arm.ConfigFile()
	cf = cf.DeepCopy()
	cf.Architecture = "arm64"
	arm, _ = mutate.ConfigFile(arm, cf)
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}})
	lp, err := layout.Write(filepath.Join(srcDir, "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendIndex(idx); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(srcDir, "img.tar")
	reg := it.ServeRegistry(t, "", "")
	defer reg.Close()
	if err := tarball.WriteToFile(archive, reg.Ref(t, "x/y:z"), img); err != nil {
		t.Fatal(err)
	}

	fromLayout := createFromImage(t, "--image", "oci-layout:"+filepath.Join(srcDir, "layout"), "--alias", "from-layout")
	id := newSandbox(t, fromLayout.TemplateID)
	check := `test ! -e /etc/gone && echo nogone; ls /opt | tr '\n' ' '; echo; cat /data/hard2; stat -c %h /data/hard1; cat /data/link; test ! -e /arm && echo amd64`
	if got := run(t, id, check); got != "nogone\nnew \nlinked2\nappamd64\n" {
		t.Errorf("layer stack seen in the sandbox:\n%s", got)
	}

	// The same layers from a docker archive: already pulled, so this
	// measures a template from already-pulled layers becoming READY.
	start := time.Now()
	fromArchive := createFromImage(t, "--image", "docker-archive:"+archive, "--alias", "from-archive")
	t.Logf("template from already-pulled layers (docker-archive, 5 layers) READY in %s (CLI round trip)", time.Since(start).Round(time.Millisecond))
	st := api(t, "GET", fmt.Sprintf("/templates/%s/builds/%s/status", fromArchive.TemplateID, fromArchive.BuildID), nil)
	if !strings.Contains(string(st.Body), "already present") {
		t.Errorf("docker-archive build did not reuse the stored layers: %s", st)
	}
	var bs struct {
		StartedAt  time.Time  `json:"startedAt"`
		FinishedAt *time.Time `json:"finishedAt"`
	}
	json.Unmarshal(st.Body, &bs)
	if bs.FinishedAt != nil {
		t.Logf("server-side build time from already-pulled layers: %s", bs.FinishedAt.Sub(bs.StartedAt).Round(time.Millisecond))
	}
	id2 := newSandbox(t, fromArchive.TemplateID)
	if got := run(t, id2, check); got != "nogone\nnew \nlinked2\nappamd64\n" {
		t.Errorf("docker-archive template:\n%s", got)
	}
}

func TestHostileLayersRefused(t *testing.T) {
	reg := it.ServeRegistry(t, "", "")
	defer reg.Close()
	target := t.TempDir() // where an escaping write would land on the host
	cases := map[string][]it.Entry{
		"symlink-write": {{Name: "evil", Type: tar.TypeSymlink, Linkname: target}, {Name: "evil/pwned", Body: "x"}},
		"traversal":     {{Name: "../../../../../../" + strings.TrimPrefix(target, "/") + "/pwned2", Body: "x"}},
		"device":        {{Name: "dev/sda", Type: tar.TypeBlock, Major: 8}},
	}
	for name, entries := range cases {
		t.Run(name, func(t *testing.T) {
			hostile := it.Layer(t, entries)
			digest, _ := hostile.DiffID()
			ref := reg.Ref(t, "hostile/"+name+":1")
			if err := remote.Write(ref, appImage(t, hostile)); err != nil {
				t.Fatal(err)
			}
			r := nook(t, 2*time.Minute, "tpl", "create-from-image", "--image", ref.String(), "--alias", "hostile-"+name)
			defer doAPI("DELETE", "/templates/hostile-"+name, nil)
			if r.Code == 0 || !strings.Contains(r.Stderr, "layer refused") {
				t.Fatalf("hostile layer %s: %s", name, r)
			}
			t.Logf("%s: %s", name, strings.TrimSpace(r.Stderr[strings.LastIndex(r.Stderr, "FAILED"):]))
			if _, err := os.Stat(filepath.Join(dataDir, "layers", "sha256", digest.Hex)); err == nil {
				t.Errorf("the refused layer was stored")
			}
			if left, _ := os.ReadDir(filepath.Join(dataDir, "layers", "tmp")); len(left) != 0 {
				t.Errorf("left in layers/tmp: %v", left)
			}
		})
	}
	if left, _ := os.ReadDir(target); len(left) != 0 {
		t.Fatalf("SECURITY: a hostile layer wrote outside its root: %v", left)
	}
}

func TestProbe(t *testing.T) {
	reg := it.ServeRegistry(t, "", "")
	defer reg.Close()
	www := it.Layer(t, []it.Entry{{Name: "www/", Type: tar.TypeDir}, {Name: "www/health", Body: "ok"}})
	img := it.Image(t, v1.Config{Env: []string{"PATH=/bin"},
		// The server comes up 2 s after the start.
		Cmd: []string{"/bin/sh", "-c", "sleep 2; exec httpd -f -p 8080 -h /www"}},
		it.BusyboxLayer(t, it.DefaultApplets...), www)
	ref := reg.Ref(t, "probe/httpd:1")
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	ok := createFromImage(t, "--image", ref.String(), "--alias", "probe-ok", "--probe", "8080", "--probe-path", "/health")
	// A create answers only once the probe passes: right after it the
	// server answers.
	start := time.Now()
	id := newSandbox(t, ok.TemplateID)
	took := time.Since(start)
	if got := run(t, id, "wget -q -O- http://127.0.0.1:8080/health"); got != "ok" {
		t.Errorf("right after create: %q", got)
	}
	if took < 2*time.Second {
		t.Errorf("create answered after %s, before the server was up (2 s)", took)
	}

	r := nook(t, 2*time.Minute, "tpl", "create-from-image", "--image", ref.String(), "--alias", "probe-bad",
		"--probe", "8080", "--probe-path", "/missing", "--probe-timeout", "4")
	defer doAPI("DELETE", "/templates/probe-bad", nil)
	if r.Code == 0 || !strings.Contains(r.Stderr, "probe") || !strings.Contains(r.Stderr, "404") {
		t.Fatalf("failing probe: %s", r)
	}
	if ti := info(t, "probe-bad"); ti.State != "FAILED" || !strings.Contains(ti.Reason, "did not pass within 4s") {
		t.Errorf("failing probe: %+v", ti)
	}
}

func TestDockerfileBuildAndCache(t *testing.T) {
	lp, err := layout.Write(filepath.Join(srcDir, "df-base"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(appImage(t)); err != nil {
		t.Fatal(err)
	}
	ctxDir := t.TempDir()
	os.WriteFile(filepath.Join(ctxDir, "hello.txt"), []byte("hello"), 0o644)
	os.MkdirAll(filepath.Join(ctxDir, "sub"), 0o755)
	os.WriteFile(filepath.Join(ctxDir, "sub", "s.txt"), []byte("sub"), 0o600)
	df := fmt.Sprintf(`FROM oci-layout:%s
ARG GREETING=hi
ENV APP=/app MODE=built
WORKDIR /app
COPY hello.txt ./
COPY sub /app/sub/
USER root
RUN echo "$GREETING $(cat hello.txt)" > built.txt && mkdir -p /data && chown 1000:1000 /data && rm /work/marker
USER 1000
CMD ["/bin/sh", "-c", "echo \"$APP $MODE $(pwd) $(id -u)\" > /tmp/started; exec sleep 100000"]
`, filepath.Join(srcDir, "df-base"))
	os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte(df), 0o644)

	first := nook(t, 5*time.Minute, "tpl", "build", "--alias", "df-app", ctxDir)
	if first.Code != 0 {
		t.Fatalf("build: %s", first)
	}
	t.Cleanup(func() { doAPI("DELETE", "/templates/df-app", nil) })
	id := newSandbox(t, "df-app")
	var started string
	for i := 0; i < 50 && started == ""; i++ {
		started = strings.TrimSpace(run(t, id, "cat /tmp/started 2>/dev/null || true"))
		time.Sleep(100 * time.Millisecond)
	}
	if started != "/app built /app 1000" {
		t.Errorf("start command saw %q", started)
	}
	got := mustNook(t, time.Minute, "sandbox", "run", "-u", "root", id, "--", "cat /app/built.txt /app/hello.txt /app/sub/s.txt; echo; stat -c '%u %a' /data /app/sub/s.txt; test ! -e /work/marker && echo removed")
	if got != "hi hello\nhellosub\n1000 755\n0 600\nremoved\n" {
		t.Errorf("built files:\n%s", got)
	}
	mustNook(t, time.Minute, "sandbox", "kill", id)

	// Unchanged: every step comes from the cache.
	start := time.Now()
	second := nook(t, 5*time.Minute, "tpl", "build", "--alias", "df-app", ctxDir)
	if second.Code != 0 || !strings.Contains(second.Stderr, "4 steps, 4 from cache") {
		t.Fatalf("rebuild: %s", second)
	}
	t.Logf("unchanged rebuild READY in %s", time.Since(start).Round(time.Millisecond))
	// A changed context file invalidates its COPY and the steps after it.
	os.WriteFile(filepath.Join(ctxDir, "hello.txt"), []byte("changed"), 0o644)
	third := nook(t, 5*time.Minute, "tpl", "build", "--alias", "df-app", ctxDir)
	if third.Code != 0 || !strings.Contains(third.Stderr, "4 steps, 1 from cache") {
		t.Fatalf("rebuild after change: %s", third)
	}
	id = newSandbox(t, "df-app")
	if got := run(t, id, "cat /app/built.txt"); got != "hi changed\n" {
		t.Errorf("after change: %q", got)
	}

	// An unsupported instruction is refused up front, naming its line.
	os.WriteFile(filepath.Join(ctxDir, "Dockerfile.bad"), []byte("FROM base\nRUN true\nADD x /x\n"), 0o644)
	r := nook(t, time.Minute, "tpl", "build", "-f", filepath.Join(ctxDir, "Dockerfile.bad"), ctxDir)
	if r.Code == 0 || !strings.Contains(r.Stderr, "line 3: unsupported instruction ADD") {
		t.Errorf("unsupported instruction: %s", r)
	}
	// A failing RUN fails the build with its exit code.
	os.WriteFile(filepath.Join(ctxDir, "Dockerfile.fail"), []byte(fmt.Sprintf("FROM oci-layout:%s\nRUN exit 3\n", filepath.Join(srcDir, "df-base"))), 0o644)
	r = nook(t, 2*time.Minute, "tpl", "build", "-f", filepath.Join(ctxDir, "Dockerfile.fail"), "--alias", "df-fail", ctxDir)
	defer doAPI("DELETE", "/templates/df-fail", nil)
	if r.Code == 0 || !strings.Contains(r.Stderr, "line 2") || !strings.Contains(r.Stderr, "exited with code 3") {
		t.Errorf("failing RUN: %s", r)
	}
}

// TestCreateTimeIndependentOfSize: sandboxes start from the template's
// layers without copying, so a create from a template with 256 MiB and
// 4000 more files takes as long as one from a small template. The times
// are logged (speed is measured, not asserted, except against a gross
// regression such as copying the root filesystem).
func TestCreateTimeIndependentOfSize(t *testing.T) {
	reg := it.ServeRegistry(t, "", "")
	defer reg.Close()
	big := []it.Entry{{Name: "big/", Type: tar.TypeDir}, {Name: "big/blob", Body: strings.Repeat("\x00", 256<<20)}}
	for i := 0; i < 4000; i++ {
		big = append(big, it.Entry{Name: fmt.Sprintf("big/f%04d", i), Body: "x"})
	}
	small := appImage(t)
	large := appImage(t, it.Layer(t, big))
	for name, img := range map[string]v1.Image{"small": small, "large": large} {
		if err := remote.Write(reg.Ref(t, "size/"+name+":1"), img); err != nil {
			t.Fatal(err)
		}
	}
	median := func(tpl string) time.Duration {
		var ds []time.Duration
		for i := 0; i < 5; i++ {
			start := time.Now()
			r := api(t, "POST", "/sandboxes", map[string]any{"templateID": tpl, "timeout": 60})
			ds = append(ds, time.Since(start))
			if r.Status != http.StatusCreated {
				t.Fatalf("create from %s: %s", tpl, r)
			}
			var sb struct{ SandboxID string }
			json.Unmarshal(r.Body, &sb)
			api(t, "DELETE", "/sandboxes/"+sb.SandboxID, nil)
		}
		for i := range ds {
			for j := i + 1; j < len(ds); j++ {
				if ds[j] < ds[i] {
					ds[i], ds[j] = ds[j], ds[i]
				}
			}
		}
		return ds[len(ds)/2]
	}
	s := createFromImage(t, "--image", reg.Ref(t, "size/small:1").String(), "--alias", "size-small")
	start := time.Now()
	l := createFromImage(t, "--image", reg.Ref(t, "size/large:1").String(), "--alias", "size-large")
	t.Logf("large template (+256 MiB, +4000 files) pulled and READY in %s", time.Since(start).Round(time.Millisecond))
	ms, ml := median(s.TemplateID), median(l.TemplateID)
	t.Logf("sandbox create, median of 5: small template %s, large template %s", ms.Round(time.Millisecond), ml.Round(time.Millisecond))
	if ml > 3*ms+time.Second {
		t.Errorf("create from the large template (%s) is far slower than from the small one (%s)", ml, ms)
	}
}
