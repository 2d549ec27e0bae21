package sandbox

import "testing"

func TestIgnorer(t *testing.T) {
	ig, err := newIgnorer([]string{"node_modules", "*.log", "/build/", "!keep.log", "docs/**/*.tmp"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		dir  bool
		want bool
	}{
		{"node_modules", true, true},
		{"a/b/node_modules", true, true},
		{"x.log", false, true},
		{"src/y.log", false, true},
		{"keep.log", false, false},
		{"build", true, true},
		{"build", false, false},
		{"src/build", true, false},
		{"docs/a/b/c.tmp", false, true},
		{"docs/c.tmp", false, true},
		{"src/main.go", false, false},
	} {
		if got := ig.match(c.path, c.dir); got != c.want {
			t.Errorf("match(%q, dir=%v) = %v, want %v", c.path, c.dir, got, c.want)
		}
	}
	if _, err := newIgnorer([]string{"[bad"}); err == nil {
		t.Error("a malformed pattern was accepted")
	}
}
