package envmodel

import (
	"errors"
	"reflect"
	"testing"
)

func ptr(s string) *string { return &s }

// derive runs one path with each layer carrying DEMO_ENV (or not) and
// returns DEMO_ENV as the process would see it ("" and false: unset).
func derive(p Path, image, sandbox, launch *string, opts Options) (string, bool) {
	img := Env{"PATH": "/img/bin"}
	if image != nil {
		img["DEMO_ENV"] = *image
	}
	sb := Env{}
	if sandbox != nil {
		sb["DEMO_ENV"] = *sandbox
	}
	call := Env{}
	l := Launch{}
	if launch != nil {
		call["DEMO_ENV"] = *launch
		l["DEMO_ENV"] = launch
	}
	var e Env
	switch p {
	case PathEnvd:
		e = Envd(img, &User{Name: "user", Home: "/home/user"}, sb, call, opts)
	case PathExec:
		e = Exec(img, sb, l)
	case PathTerminal:
		e = Terminal(img, l)
	case PathRunCode:
		e = RunCode(img, sb, call, opts)
	case PathOCIExec:
		e = OCIExec(img)
	case PathMain:
		e = Main(img)
	}
	v, ok := e["DEMO_ENV"]
	return v, ok
}

// TestCubeSandboxTable is the seed's visibility table, one row per source
// and one column per path, with both opt-ins off and on.
func TestCubeSandboxTable(t *testing.T) {
	type cell struct {
		path Path
		want string // "" = not visible
	}
	rows := []struct {
		name                   string
		image, sandbox, launch *string
		opts                   Options
		cells                  []cell
	}{
		{
			name: "image ENV / template --env", image: ptr("template-only"),
			cells: []cell{{PathEnvd, ""}, {PathOCIExec, "template-only"}, {PathMain, "template-only"}, {PathRunCode, "template-only"}},
		},
		{
			name: "image ENV with envd inherit opt-in", image: ptr("template-only"), opts: Options{EnvdInheritImage: true},
			cells: []cell{{PathEnvd, "template-only"}, {PathOCIExec, "template-only"}, {PathMain, "template-only"}, {PathRunCode, "template-only"}},
		},
		{
			name: "Sandbox.create(envs)", sandbox: ptr("sandbox-only"),
			cells: []cell{{PathEnvd, "sandbox-only"}, {PathOCIExec, ""}, {PathMain, ""}, {PathRunCode, ""}},
		},
		{
			name: "Sandbox.create(envs) with run-code inherit opt-in", sandbox: ptr("sandbox-only"), opts: Options{RunCodeInheritSandbox: true},
			cells: []cell{{PathEnvd, "sandbox-only"}, {PathOCIExec, ""}, {PathMain, ""}, {PathRunCode, "sandbox-only"}},
		},
		{
			name: "call envs beat sandbox envs", sandbox: ptr("sandbox-only"), launch: ptr("one-shot"),
			cells: []cell{{PathEnvd, "one-shot"}, {PathRunCode, "one-shot"}},
		},
		{
			name: "call envs beat image env (envd opt-in on)", image: ptr("template-only"), launch: ptr("one-shot"), opts: Options{EnvdInheritImage: true},
			cells: []cell{{PathEnvd, "one-shot"}, {PathRunCode, "one-shot"}},
		},
		{
			name: "all layers, defaults", image: ptr("template-only"), sandbox: ptr("sandbox-only"), launch: ptr("one-shot"),
			cells: []cell{{PathEnvd, "one-shot"}, {PathOCIExec, "template-only"}, {PathMain, "template-only"}, {PathRunCode, "one-shot"}},
		},
		{
			name: "run_code without execution envs, both layers", image: ptr("template-only"), sandbox: ptr("sandbox-only"),
			cells: []cell{{PathRunCode, "template-only"}, {PathEnvd, "sandbox-only"}},
		},
		{
			name: "run_code with inherit opt-in, both layers", image: ptr("template-only"), sandbox: ptr("sandbox-only"), opts: Options{RunCodeInheritSandbox: true},
			cells: []cell{{PathRunCode, "sandbox-only"}},
		},
	}
	for _, r := range rows {
		for _, c := range r.cells {
			got, _ := derive(c.path, r.image, r.sandbox, r.launch, r.opts)
			if got != c.want {
				t.Errorf("%s / %s: DEMO_ENV=%q, want %q", r.name, c.path, got, c.want)
			}
		}
	}
}

// TestCloudflareRules is the Cloudflare page, rule by rule.
func TestCloudflareRules(t *testing.T) {
	image := Env{"PATH": "/usr/bin", "NODE_ENV": "development", "IMG": "1"}
	stored := Env{"NODE_ENV": "production", "APP_HOME": "/workspace/app", "LOG_LEVEL": "info"}

	// Merge order: container environment, then setEnvVars, then this env.
	e := Exec(image, stored, Launch{"LOG_LEVEL": ptr("debug"), "PORT": ptr("3000")})
	want := Env{"PATH": "/usr/bin", "NODE_ENV": "production", "IMG": "1", "APP_HOME": "/workspace/app", "LOG_LEVEL": "debug", "PORT": "3000"}
	if !reflect.DeepEqual(e, want) {
		t.Errorf("exec env = %v, want %v", e, want)
	}
	// Launch env does not update stored names, nor the image env.
	if stored["LOG_LEVEL"] != "info" || len(stored) != 3 || image["NODE_ENV"] != "development" {
		t.Errorf("inputs modified: stored %v image %v", stored, image)
	}
	// A nil launch value removes a name for this launch only, whatever layer it came from.
	e = Exec(image, stored, Launch{"NODE_ENV": nil, "IMG": nil})
	if _, ok := e["NODE_ENV"]; ok {
		t.Errorf("NODE_ENV survived a nil launch value: %v", e)
	}
	if _, ok := e["IMG"]; ok {
		t.Errorf("IMG survived a nil launch value: %v", e)
	}
	if e2 := Exec(image, stored, nil); e2["NODE_ENV"] != "production" || e2["IMG"] != "1" {
		t.Errorf("removal leaked into the next launch: %v", e2)
	}
	// Terminals: container env + launch env, stored names not merged, TERM.
	tm := Terminal(image, Launch{"APP_HOME": ptr("/workspace/app")})
	want = Env{"PATH": "/usr/bin", "NODE_ENV": "development", "IMG": "1", "APP_HOME": "/workspace/app", "TERM": "xterm-256color"}
	if !reflect.DeepEqual(tm, want) {
		t.Errorf("terminal env = %v, want %v", tm, want)
	}
	if _, ok := Terminal(image, nil)["LOG_LEVEL"]; ok {
		t.Error("terminal saw a stored name")
	}
	// Names: non-empty, no '=' or NUL.
	for _, bad := range []string{"", "A=B", "A\x00B", "="} {
		if err := ValidateName(bad); !errors.Is(err, ErrInvalidName) {
			t.Errorf("ValidateName(%q) = %v", bad, err)
		}
		if err := ValidateLaunch(Launch{bad: nil}); err == nil {
			t.Errorf("ValidateLaunch accepted %q", bad)
		}
	}
	for _, good := range []string{"A", "a_b", "X-Y", "1X", "DEMO ENV"} {
		if err := ValidateName(good); err != nil {
			t.Errorf("ValidateName(%q) = %v", good, err)
		}
	}
	if err := Validate(Env{"A": "x\x00y"}); err == nil {
		t.Error("NUL in a value accepted")
	}
}

func TestEnvdFixedNames(t *testing.T) {
	img := Env{"PATH": "/opt/bin:/usr/bin", "SECRET_IMG": "x", "HOME": "/root"}
	e := Envd(img, &User{Name: "user", Home: "/home/user"}, Env{"S": "1"}, Env{"USER": "override"}, Options{})
	want := Env{"PATH": "/opt/bin:/usr/bin", "HOME": "/home/user", "USER": "override", "LOGNAME": "user", "S": "1"}
	if !reflect.DeepEqual(e, want) {
		t.Errorf("envd env = %v, want %v", e, want)
	}
	if p := Envd(Env{}, nil, nil, nil, Options{})["PATH"]; p != DefaultPath {
		t.Errorf("default PATH = %q", p)
	}
}

func TestImageDefaultsAndList(t *testing.T) {
	e := Image([]string{"A=1", "bad", "=x", "A=2", "B=x=y"}, "/root")
	want := Env{"A": "2", "B": "x=y", "PATH": DefaultPath, "HOME": "/root"}
	if !reflect.DeepEqual(e, want) {
		t.Errorf("Image = %v, want %v", e, want)
	}
	if got := Image([]string{"HOME=/h", "PATH=/p"}, "/root"); got["HOME"] != "/h" || got["PATH"] != "/p" {
		t.Errorf("Image overrode the image's own HOME/PATH: %v", got)
	}
	if l := (Env{"B": "2", "A": "1"}).List(); !reflect.DeepEqual(l, []string{"A=1", "B=2"}) {
		t.Errorf("List = %v", l)
	}
}

func TestVisibility(t *testing.T) {
	off, on := Options{}, Options{EnvdInheritImage: true, RunCodeInheritSandbox: true}
	cases := []struct {
		p    Path
		opts Options
		want Sources
	}{
		{PathEnvd, off, Sources{Sandbox: true, Launch: true}},
		{PathEnvd, on, Sources{Image: true, Sandbox: true, Launch: true}},
		{PathOCIExec, on, Sources{Image: true}},
		{PathMain, on, Sources{Image: true}},
		{PathRunCode, off, Sources{Image: true, Launch: true}},
		{PathRunCode, on, Sources{Image: true, Sandbox: true, Launch: true}},
		{PathExec, off, Sources{Image: true, Sandbox: true, Launch: true}},
		{PathTerminal, off, Sources{Image: true, Launch: true}},
	}
	for _, c := range cases {
		if got := Visibility(c.p, c.opts); got != c.want {
			t.Errorf("Visibility(%s, %+v) = %+v, want %+v", c.p, c.opts, got, c.want)
		}
		// The model agrees with the functions.
		v := "x"
		img, _ := derive(c.p, &v, nil, nil, c.opts)
		if (img == "x") != c.want.Image {
			t.Errorf("%s: image visible = %v, Visibility says %v", c.p, img == "x", c.want.Image)
		}
		if c.p != PathOCIExec && c.p != PathMain {
			sb, _ := derive(c.p, nil, &v, nil, c.opts)
			if (sb == "x") != c.want.Sandbox {
				t.Errorf("%s: sandbox visible = %v, Visibility says %v", c.p, sb == "x", c.want.Sandbox)
			}
		}
	}
}
