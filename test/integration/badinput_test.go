package integration

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// stateSnapshot is what a request must not change: the sandboxes nook
// lists and the per-sandbox directories in the data dir.
type stateSnapshot struct {
	ids, bundles, runs, runc []string
}

func snapshot(t testing.TB) stateSnapshot {
	t.Helper()
	s := stateSnapshot{
		ids:     listSandboxIDs(t),
		bundles: dirEntries(t, filepath.Join(dataDir, "bundles")),
		runs:    dirEntries(t, filepath.Join(dataDir, "run")),
		runc:    dirEntries(t, filepath.Join(dataDir, "runc")),
	}
	for _, l := range [][]string{s.ids, s.bundles, s.runs, s.runc} {
		slices.Sort(l)
	}
	return s
}

// poolTotal returns how many warm (pooled, unlisted) sandboxes nook keeps
// now (0 for a nook without a pool).
func poolTotal(t testing.TB) int {
	t.Helper()
	r := api(t, "GET", "/v1/pool", nil)
	if r.Status == http.StatusNotFound {
		return 0
	}
	var sizes map[string]int
	if r.Status != http.StatusOK || json.Unmarshal(r.Body, &sizes) != nil {
		t.Fatalf("GET /v1/pool: %s", r)
	}
	n := 0
	for _, v := range sizes {
		n += v
	}
	return n
}

// settledSnapshot waits (bounded) until nook's warm pool is not booting
// anything, i.e. every sandbox directory belongs to a listed sandbox or a
// counted warm one, the same in three looks in a row, and returns it.
func settledSnapshot(t testing.TB) stateSnapshot {
	t.Helper()
	var prev stateSnapshot
	stable := 0
	for i := 0; i < 150; i++ {
		s := snapshot(t)
		unlisted := 0
		for _, b := range s.bundles {
			if !slices.Contains(s.ids, b) {
				unlisted++
			}
		}
		if unlisted == poolTotal(t) && i > 0 && prev.diff(s) == "" {
			stable++
		} else {
			stable = 0
		}
		if stable >= 2 {
			return s
		}
		prev = s
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("nook's state did not settle (warm pool still booting?): %+v", prev)
	return prev
}

func (s stateSnapshot) diff(o stateSnapshot) string {
	var d []string
	for _, c := range []struct {
		name     string
		was, now []string
	}{{"sandboxes", s.ids, o.ids}, {"bundles", s.bundles, o.bundles}, {"run", s.runs, o.runs}, {"runc", s.runc, o.runc}} {
		if !slices.Equal(c.was, c.now) {
			d = append(d, c.name+": "+strings.Join(c.was, ",")+" -> "+strings.Join(c.now, ","))
		}
	}
	return strings.Join(d, "; ")
}

// requireAPIError checks the {code, message} error body of r.
func requireAPIError(t testing.TB, r response) {
	t.Helper()
	var e struct {
		Code    *int    `json:"code"`
		Message *string `json:"message"`
	}
	if err := json.Unmarshal(r.Body, &e); err != nil || e.Code == nil || e.Message == nil || *e.Message == "" {
		t.Errorf("error body is not {code, message}: %s (%v)", r, err)
		return
	}
	if *e.Code != r.Status {
		t.Errorf("error body code %d differs from HTTP status %d", *e.Code, r.Status)
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("error Content-Type %q, want application/json", ct)
	}
}

// TestBadInput: malformed or hostile REST requests get a 4xx with a JSON
// error, never a 500, and create nothing.
func TestBadInput(t *testing.T) {
	existing := createSandbox(t)
	big := `{"templateID":"base","metadata":{"k":"` + strings.Repeat("x", 2<<20) + `"}}`

	type tc struct {
		name, method, path, body string
		hdr                      map[string]string
		want                     []int
		noJSON                   bool // the answer may come from the router, not nook's handlers
	}
	cases := []tc{
		{name: "MalformedJSON", method: "POST", path: "/sandboxes", body: `{"templateID":`, want: []int{400}},
		{name: "NotAnObject", method: "POST", path: "/sandboxes", body: `["base"]`, want: []int{400}},
		{name: "WrongFieldType", method: "POST", path: "/sandboxes", body: `{"templateID":42}`, want: []int{400}},
		{name: "TrailingGarbage", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"nope"} {`, want: []int{400, 404}},
		{name: "MissingTemplate", method: "POST", path: "/sandboxes", body: `{}`, want: []int{400}},
		{name: "UnknownTemplate", method: "POST", path: "/sandboxes", body: `{"templateID":"no-such-template"}`, want: []int{404}},
		{name: "PathTemplate", method: "POST", path: "/sandboxes", body: `{"templateID":"../../etc"}`, want: []int{400, 404}},
		{name: "EmptyEnvName", method: "POST", path: "/sandboxes", body: `{"templateID":"base","envVars":{"":"x"}}`, want: []int{400}},
		{name: "EnvNameWithEquals", method: "POST", path: "/sandboxes", body: `{"templateID":"base","envVars":{"A=B":"x"}}`, want: []int{400}},
		{name: "EnvNameWithNUL", method: "POST", path: "/sandboxes", body: `{"templateID":"base","envVars":{"A\u0000B":"x"}}`, want: []int{400}},
		{name: "EnvValueWithNUL", method: "POST", path: "/sandboxes", body: `{"templateID":"base","envVars":{"A":"x\u0000y"}}`, want: []int{400}},
		{name: "OversizedBody", method: "POST", path: "/sandboxes", body: big, want: []int{413}},
		{name: "ZeroTimeout", method: "POST", path: "/sandboxes", body: `{"templateID":"base","timeout":0}`, want: []int{400}},
		{name: "NegativeTimeout", method: "POST", path: "/sandboxes", body: `{"templateID":"base","timeout":-5}`, want: []int{400}},
		{name: "TimeoutAboveMax", method: "POST", path: "/sandboxes", body: `{"templateID":"base","timeout":90000}`, want: []int{400}},
		{name: "TimeoutOverflowingToNegative", method: "POST", path: "/sandboxes", body: `{"templateID":"base","timeout":9223372037}`, want: []int{400}},
		// 18446744074 s is 2^64 ns + 0.29 s: an unchecked multiplication
		// by time.Second wraps to a valid-looking 0.29 s.
		{name: "TimeoutOverflowingToSmall", method: "POST", path: "/sandboxes", body: `{"templateID":"base","timeout":18446744074}`, want: []int{400}},
		{name: "UnknownSandboxGet", method: "GET", path: "/sandboxes/izzzzzzzzzzzzzzzzzzzz", want: []int{404}},
		{name: "UnknownSandboxDelete", method: "DELETE", path: "/sandboxes/izzzzzzzzzzzzzzzzzzzz", want: []int{404}},
		{name: "UnknownSandboxTimeout", method: "POST", path: "/sandboxes/izzzzzzzzzzzzzzzzzzzz/timeout", body: `{"timeout":30}`, want: []int{404}},
		{name: "UnknownSandboxConnect", method: "POST", path: "/sandboxes/izzzzzzzzzzzzzzzzzzzz/connect", body: `{"timeout":30}`, want: []int{404}},
		{name: "DotDotIDEscaped", method: "GET", path: "/sandboxes/..%2Fetc", want: []int{400, 404}},
		{name: "DotDotIDDeleteEscaped", method: "DELETE", path: "/sandboxes/..%2Ftemplates", want: []int{400, 404}},
		{name: "DotDotIDRaw", method: "DELETE", path: "/sandboxes/../etc", want: []int{301, 307, 308, 400, 404, 405}, noJSON: true},
		{name: "SpaceID", method: "GET", path: "/sandboxes/A%20B", want: []int{400, 404}},
		{name: "SpaceIDDelete", method: "DELETE", path: "/sandboxes/A%20B", want: []int{400, 404}},
		{name: "UppercaseID", method: "DELETE", path: "/sandboxes/" + strings.ToUpper(existing), want: []int{400, 404}},
		{name: "LongID", method: "GET", path: "/sandboxes/" + strings.Repeat("a", 5000), want: []int{400, 404, 414, 431}, noJSON: true},
		{name: "NULID", method: "DELETE", path: "/sandboxes/a%00b", want: []int{400, 404}},
		{name: "MissingAPIKey", method: "GET", path: "/sandboxes", hdr: map[string]string{"X-API-Key": ""}, want: []int{401}},
		{name: "WrongAPIKey", method: "GET", path: "/sandboxes", hdr: map[string]string{"X-API-Key": "wrong-key"}, want: []int{401}},
		{name: "WrongBearer", method: "POST", path: "/sandboxes", body: `{"templateID":"base"}`, hdr: map[string]string{"X-API-Key": "", "Authorization": "Bearer wrong-key"}, want: []int{401}},
		{name: "KeyPrefix", method: "POST", path: "/sandboxes", body: `{"templateID":"base"}`, hdr: map[string]string{"X-API-Key": apiKey[:len(apiKey)-1]}, want: []int{401}},
		{name: "WrongKeyDelete", method: "DELETE", path: "/sandboxes/" + existing, hdr: map[string]string{"X-API-Key": "wrong-key"}, want: []int{401}},
		{name: "SetTimeoutZero", method: "POST", path: "/sandboxes/" + existing + "/timeout", body: `{"timeout":0}`, want: []int{400}},
		{name: "SetTimeoutNegative", method: "POST", path: "/sandboxes/" + existing + "/timeout", body: `{"timeout":-1}`, want: []int{400}},
		{name: "SetTimeoutMissing", method: "POST", path: "/sandboxes/" + existing + "/timeout", body: `{}`, want: []int{400}},
		{name: "SetTimeoutMalformed", method: "POST", path: "/sandboxes/" + existing + "/timeout", body: `{"timeout":"soon"}`, want: []int{400}},
		{name: "BadListLimit", method: "GET", path: "/v2/sandboxes?limit=0", want: []int{400}},
		{name: "BadListState", method: "GET", path: "/v2/sandboxes?state=zombie", want: []int{400}},
	}
	base := settledSnapshot(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var body []byte
			if c.body != "" {
				body = []byte(c.body)
			}
			r := do(t, c.method, apiURL+c.path, body, c.hdr)
			if !slices.Contains(c.want, r.Status) {
				t.Errorf("%s %s: %s, want one of %v", c.method, clip(c.path), r, c.want)
			}
			if r.Status >= 500 {
				t.Errorf("%s %s: server error %s", c.method, clip(c.path), r)
			}
			if !c.noJSON && r.Status >= 400 {
				requireAPIError(t, r)
			}
			if r.Status == http.StatusCreated {
				// A wrongly accepted create: do not leak it.
				var sb struct {
					SandboxID string `json:"sandboxID"`
				}
				if json.Unmarshal(r.Body, &sb) == nil && sb.SandboxID != "" {
					t.Errorf("a sandbox (%s) was created from bad input", sb.SandboxID)
					killQuiet(sb.SandboxID)
					base = settledSnapshot(t)
					return
				}
			}
			if base.diff(snapshot(t)) != "" {
				// Maybe only the warm pool moved: look again once it settled.
				now := settledSnapshot(t)
				if d := base.diff(now); d != "" {
					t.Errorf("%s %s changed nook's state: %s", c.method, clip(c.path), d)
				}
				base = now
			}
		})
	}

	// The sandbox the cases aimed at is untouched.
	if got := strings.TrimSpace(mustRun(t, existing, "user", "echo intact")); got != "intact" {
		t.Errorf("sandbox %s after the bad requests: %q", existing, got)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "templates")); err != nil {
		t.Errorf("the templates dir is gone: %v", err)
	}

	t.Run("SetTimeoutOverflowingToSmall", func(t *testing.T) {
		id := createSandbox(t)
		r := api(t, "POST", "/sandboxes/"+id+"/timeout", []byte(`{"timeout":18446744074}`))
		if r.Status != http.StatusBadRequest {
			t.Errorf("POST /sandboxes/%s/timeout {timeout: 18446744074}: %s, want 400", id, r)
		}
		// An end time that wrapped around (to now + 0.29 s) kills the
		// sandbox at once.
		time.Sleep(time.Second)
		if g := api(t, "GET", "/sandboxes/"+id, nil); g.Status != http.StatusOK {
			t.Errorf("sandbox %s is gone a second after that set-timeout (its end time wrapped around to now + 0.29 s): %s", id, g)
		}
	})
}
