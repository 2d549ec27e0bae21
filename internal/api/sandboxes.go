package api

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nookhq/nook/internal/agentwire"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/sandbox"
)

func (s *Server) sandboxRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /sandboxes", s.createSandbox)
	mux.HandleFunc("POST /v2/sandboxes", s.createSandbox)
	mux.HandleFunc("GET /sandboxes", s.listSandboxesV1)
	mux.HandleFunc("GET /v2/sandboxes", s.listSandboxesV2)
	mux.HandleFunc("GET /sandboxes/{id}", s.getSandbox)
	mux.HandleFunc("DELETE /sandboxes/{id}", s.killSandbox)
	mux.HandleFunc("POST /sandboxes/{id}/timeout", s.setTimeout)
	mux.HandleFunc("POST /sandboxes/{id}/refreshes", s.refresh)
	mux.HandleFunc("POST /sandboxes/{id}/connect", s.connect)
	mux.HandleFunc("POST /v2/sandboxes/{id}/connect", s.connect)
}

// newSandboxBody is E2B's NewSandbox. Fields nook does not act on yet are
// accepted and ignored, as the SDK always sends some of them.
type newSandboxBody struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *e2bNetworkBody   `json:"network"`
	AutoPause           *bool             `json:"autoPause"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory"`
	AutoResume          *autoResumeBody   `json:"autoResume"`
}

// sandboxBody is E2B's Sandbox (the create and connect answer).
type sandboxBody struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	ClientID           string  `json:"clientID"`
	Alias              string  `json:"alias,omitempty"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// sandboxDetail is E2B's SandboxDetail and ListedSandbox.
type sandboxDetail struct {
	TemplateID      string            `json:"templateID"`
	SandboxID       string            `json:"sandboxID"`
	ClientID        string            `json:"clientID"`
	Alias           string            `json:"alias,omitempty"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	Domain          *string           `json:"domain"`
	CPUCount        int64             `json:"cpuCount"`
	MemoryMB        int64             `json:"memoryMB"`
	DiskSizeMB      int64             `json:"diskSizeMB"`
	Metadata        map[string]string `json:"metadata"`
	State           string            `json:"state"`
	// AllowInternetAccess and Network are set by GET /sandboxes/{id} only.
	AllowInternetAccess *bool       `json:"allowInternetAccess,omitempty"`
	Network             *e2bNetwork `json:"network,omitempty"`
	pauseDetail                     // lifecycle and pause mode (pause.go)
}

const clientID = "nook"

func (s *Server) domain() *string {
	if s.Domain == "" {
		return nil
	}
	return &s.Domain
}

func (s *Server) sandboxBody(sb sandbox.Sandbox) sandboxBody {
	return sandboxBody{
		TemplateID: sb.TemplateID, SandboxID: sb.ID, ClientID: clientID, Alias: sb.Alias,
		EnvdVersion: agentwire.EnvdVersion, EnvdAccessToken: sb.AccessToken, Domain: s.domain(),
	}
}

func (s *Server) detail(sb sandbox.Sandbox, withToken bool) sandboxDetail {
	d := sandboxDetail{
		TemplateID: sb.TemplateID, SandboxID: sb.ID, ClientID: clientID, Alias: sb.Alias,
		StartedAt: sb.StartedAt, EndAt: sb.EndAt, EnvdVersion: agentwire.EnvdVersion,
		Domain: s.domain(), CPUCount: max(1, (sb.CPUMillis+999)/1000), MemoryMB: sb.MemoryMB,
		DiskSizeMB: sb.DiskMB, Metadata: sb.Metadata, State: sb.State,
	}
	if d.Metadata == nil {
		d.Metadata = map[string]string{}
	}
	d.pauseDetail = pauseDetailOf(sb)
	if withToken {
		d.EnvdAccessToken = sb.AccessToken
	}
	return d
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	var body newSandboxBody
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	if body.TemplateID == "" {
		s.fail(w, r, fmt.Errorf("templateID is required: %w", errdefs.ErrInvalid))
		return
	}
	var timeout time.Duration
	if body.Timeout != nil {
		secs, err := secondsField("timeout", *body.Timeout, false)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		timeout = secs
	}
	// A client that goes away must not leave a half-made sandbox; the
	// manager cleans up on its own context, so let the create finish.
	netCfg, err := body.Network.networkConfig(body.AllowInternetAccess)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	sb, err := s.Sandboxes.Create(context.WithoutCancel(r.Context()), sandbox.CreateOptions{
		Template: body.TemplateID, Timeout: timeout, Metadata: body.Metadata, EnvVars: body.EnvVars, Network: netCfg,
		NoPool: r.Header.Get("Nook-Pool") == "off", Lifecycle: body.lifecycle(),
	})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.sandboxBody(sb))
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.Sandboxes.Get(r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	d := s.detail(sb, true)
	// The e2b SDK's getInfo reads the egress settings back (secrets
	// redacted); a nook without networking has none to show.
	if cfg, err := s.Sandboxes.NetworkOf(sb.ID); err == nil {
		allow := cfg.AllowInternet == nil || *cfg.AllowInternet
		d.AllowInternetAccess = &allow
		d.Network = &e2bNetwork{AllowOut: cfg.AllowOut, DenyOut: cfg.DenyOut, Rules: cfg.Rules}
	}
	writeJSON(w, http.StatusOK, d)
}

// e2bNetwork is the network part of E2B's SandboxDetail.
type e2bNetwork struct {
	AllowOut []string                         `json:"allowOut,omitempty"`
	DenyOut  []string                         `json:"denyOut,omitempty"`
	Rules    map[string][]sandbox.NetworkRule `json:"rules,omitempty"`
}

func (s *Server) killSandbox(w http.ResponseWriter, r *http.Request) {
	if err := s.Sandboxes.Kill(context.WithoutCancel(r.Context()), r.PathValue("id")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// seconds reads {field: int seconds} from the body.
func seconds(w http.ResponseWriter, r *http.Request, field string) (time.Duration, error) {
	var body map[string]*int64
	if err := decode(w, r, &body); err != nil {
		return 0, err
	}
	v := body[field]
	if v == nil {
		return 0, fmt.Errorf("%s is required: %w", field, errdefs.ErrInvalid)
	}
	return secondsField(field, *v, true)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	d, err := seconds(w, r, "timeout")
	if err == nil {
		_, err = s.Sandboxes.SetTimeout(r.PathValue("id"), d)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) refresh(w http.ResponseWriter, r *http.Request) {
	d, err := seconds(w, r, "duration")
	if err == nil {
		_, err = s.Sandboxes.Extend(r.PathValue("id"), d)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// connect answers 200 for a running sandbox, extending its end time to at
// least now + timeout.
// A paused sandbox is resumed first and answered with 201 (see pause.go).
func (s *Server) connect(w http.ResponseWriter, r *http.Request) {
	s.connectOrResume(w, r, false)
}

// metadataFilter parses E2B's metadata query ("k=v&k2=v2", URL-encoded).
func metadataFilter(q string) (map[string]string, error) {
	if q == "" {
		return nil, nil
	}
	vals, err := url.ParseQuery(q)
	if err != nil {
		return nil, fmt.Errorf("metadata filter: %v: %w", err, errdefs.ErrInvalid)
	}
	out := map[string]string{}
	for k, v := range vals {
		out[k] = v[len(v)-1]
	}
	return out, nil
}

func matches(sb sandbox.Sandbox, md map[string]string) bool {
	for k, v := range md {
		if sb.Metadata[k] != v {
			return false
		}
	}
	return true
}

func (s *Server) filtered(r *http.Request) ([]sandbox.Sandbox, error) {
	md, err := metadataFilter(r.URL.Query().Get("metadata"))
	if err != nil {
		return nil, err
	}
	states := map[string]bool{}
	if st := r.URL.Query().Get("state"); st != "" {
		for _, v := range strings.Split(st, ",") {
			if v != "running" && v != "paused" {
				return nil, fmt.Errorf("state %q: want running or paused: %w", v, errdefs.ErrInvalid)
			}
			states[v] = true
		}
	}
	var out []sandbox.Sandbox
	for _, sb := range s.Sandboxes.List() {
		if (len(states) == 0 || states[sb.State]) && matches(sb, md) {
			out = append(out, sb)
		}
	}
	return out, nil
}

func (s *Server) listSandboxesV1(w http.ResponseWriter, r *http.Request) {
	list, err := s.filtered(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]sandboxDetail, 0, len(list))
	for _, sb := range list {
		out = append(out, s.detail(sb, false))
	}
	writeJSON(w, http.StatusOK, out)
}

// listSandboxesV2 pages through the newest-first list; nextToken is the id
// of the first sandbox of the next page.
func (s *Server) listSandboxesV2(w http.ResponseWriter, r *http.Request) {
	list, err := s.filtered(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	limit := 100
	if l := r.URL.Query().Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			s.fail(w, r, fmt.Errorf("limit must be 1..1000: %w", errdefs.ErrInvalid))
			return
		}
		limit = n
	}
	start := 0
	if tok := r.URL.Query().Get("nextToken"); tok != "" {
		start = -1
		for i, sb := range list {
			if sb.ID == tok {
				start = i
			}
		}
		if start < 0 {
			start = len(list) // that sandbox is gone: the listing has moved on
		}
	}
	end := min(start+limit, len(list))
	if end < len(list) {
		w.Header().Set("X-Next-Token", list[end].ID)
	}
	out := make([]sandboxDetail, 0, end-start)
	for _, sb := range list[start:end] {
		out = append(out, s.detail(sb, false))
	}
	writeJSON(w, http.StatusOK, out)
}
