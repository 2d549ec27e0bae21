package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nookhq/nook/internal/agentwire"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/image"
	"github.com/nookhq/nook/internal/runtime/runc"
	"github.com/nookhq/nook/internal/sandbox"
	"github.com/nookhq/nook/internal/template"
)

// maxContext bounds an uploaded Dockerfile build context.
const maxContext = 4 << 30

var (
	buildersMu sync.Mutex
	builders   = map[*template.Registry]*template.Builder{}
)

// builder returns the one template builder of s's registry.
func (s *Server) builder() (*template.Builder, error) {
	buildersMu.Lock()
	defer buildersMu.Unlock()
	if b := builders[s.Templates]; b != nil {
		return b, nil
	}
	cfg := template.BuilderConfig{
		Log: s.Log,
		Probe: func(ctx context.Context, id string) error {
			sb, err := s.Sandboxes.Create(ctx, sandbox.CreateOptions{Template: id, Timeout: 5 * time.Minute, NoPool: true})
			if err != nil {
				return err
			}
			return s.Sandboxes.Kill(context.WithoutCancel(ctx), sb.ID)
		},
		InUse: func(id string) []string {
			var ids []string
			for _, sb := range s.Sandboxes.List() {
				if sb.TemplateID == id {
					ids = append(ids, sb.ID)
				}
			}
			return ids
		},
		Drain: func(ctx context.Context, id string) { s.Sandboxes.DrainPool(ctx, id) },
	}
	if drv, err := runc.New(s.Templates.DataDir()); err == nil {
		cfg.Runner = drv
	} else {
		s.Log.Warn("Dockerfile RUN steps are unavailable", "err", err)
	}
	b, err := template.NewBuilder(s.Templates, cfg)
	if err != nil {
		return nil, err
	}
	builders[s.Templates] = b
	return b, nil
}

func (s *Server) templateRoutes(mux *http.ServeMux) {
	b, err := s.builder()
	if err != nil {
		s.Log.Error("template builder", "err", err)
		mux.HandleFunc("/templates", func(w http.ResponseWriter, r *http.Request) {
			s.fail(w, r, fmt.Errorf("template builds are unavailable: %v: %w", err, errdefs.ErrUnavailable))
		})
		return
	}
	h := &templateHandlers{s: s, b: b}
	mux.HandleFunc("GET /templates", h.list)
	mux.HandleFunc("POST /templates", h.create)
	mux.HandleFunc("GET /templates/{id}", h.get)
	mux.HandleFunc("PATCH /templates/{id}", h.patch)
	mux.HandleFunc("DELETE /templates/{id}", h.delete)
	mux.HandleFunc("GET /templates/{id}/builds/{buildID}", h.status)
	mux.HandleFunc("GET /templates/{id}/builds/{buildID}/status", h.status)
	mux.HandleFunc("GET /templates/{id}/builds/{buildID}/logs", h.logs)
	mux.HandleFunc("GET /templates/aliases/{alias}", h.alias)
}

type templateHandlers struct {
	s *Server
	b *template.Builder
}

// templateBody is a template as the API shows it: E2B's Template fields
// plus nook's build state and run configuration.
type templateBody struct {
	TemplateID   string   `json:"templateID"`
	BuildID      string   `json:"buildID"`
	Aliases      []string `json:"aliases"`
	Public       bool     `json:"public"`
	BuildStatus  string   `json:"buildStatus"` // E2B: building, ready, error
	State        string   `json:"state"`       // PULLING, BUILDING, READY, FAILED
	Reason       string   `json:"reason,omitempty"`
	Source       string   `json:"source,omitempty"`
	CPUCount     int64    `json:"cpuCount"`
	CPUMillis    int64    `json:"cpuMillis"`
	MemoryMB     int64    `json:"memoryMB"`
	DiskSizeMB   int64    `json:"diskSizeMB"`
	EnvdVersion  string   `json:"envdVersion"`
	Layers       int      `json:"layers"`
	Env          []string `json:"env"`
	Cmd          []string `json:"cmd,omitempty"`
	WorkingDir   string   `json:"workingDir,omitempty"`
	User         string   `json:"user,omitempty"`
	ExposedPorts []int    `json:"exposedPorts,omitempty"`
	ProbePort    int      `json:"probePort,omitempty"`
	ProbePath    string   `json:"probePath,omitempty"`
	DNS          []string `json:"dns,omitempty"`
	// The template's default egress policy (allowInternetAccess is always
	// shown: true unless the template turned it off) and env opt-ins.
	AllowInternetAccess      bool      `json:"allowInternetAccess"`
	AllowOut                 []string  `json:"allowOut,omitempty"`
	DenyOut                  []string  `json:"denyOut,omitempty"`
	EnvdInheritImageEnv      bool      `json:"envdInheritImageEnv"`
	RunCodeInheritSandboxEnv bool      `json:"runCodeInheritSandboxEnv"`
	CodeInterpreter          bool      `json:"codeInterpreter"`
	CreatedAt                time.Time `json:"createdAt"`
	UpdatedAt                time.Time `json:"updatedAt"`
	// Builds are the template's builds, newest first (details only).
	Builds []template.Build `json:"builds,omitempty"`
}

func toBody(t template.Template) templateBody {
	status := map[string]string{template.StateReady: "ready", template.StateFailed: "error"}[t.State]
	if status == "" {
		status = "building"
	}
	up := t.UpdatedAt
	if up.IsZero() {
		up = t.CreatedAt
	}
	aliases := t.Aliases
	if aliases == nil {
		aliases = []string{}
	}
	return templateBody{
		TemplateID: t.ID, BuildID: t.BuildID, Aliases: aliases, Public: true, BuildStatus: status,
		State: t.State, Reason: t.Reason, Source: t.Source,
		CPUCount: max(1, (t.CPUMillis+999)/1000), CPUMillis: t.CPUMillis, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskMB,
		EnvdVersion: agentwire.EnvdVersion, Layers: len(t.Layers), Env: t.Env, Cmd: t.Cmd,
		WorkingDir: t.WorkingDir, User: t.User, ExposedPorts: t.ExposedPorts, ProbePort: t.ProbePort,
		ProbePath: t.ProbePath, DNS: t.DNS, CreatedAt: t.CreatedAt, UpdatedAt: up,
		AllowInternetAccess: t.AllowInternetAccess == nil || *t.AllowInternetAccess,
		AllowOut:            t.AllowOut, DenyOut: t.DenyOut,
		EnvdInheritImageEnv: t.EnvdInheritImageEnv, RunCodeInheritSandboxEnv: t.RunCodeInheritSandboxEnv,
		CodeInterpreter: t.CodeInterpreter,
	}
}

func (h *templateHandlers) lookup(idOrAlias string) (template.Template, error) {
	t, err := h.s.Templates.Get(idOrAlias)
	if err == nil && t.Internal {
		err = fmt.Errorf("template %q: %w", idOrAlias, errdefs.ErrNotFound)
	}
	return t, err
}

func (h *templateHandlers) list(w http.ResponseWriter, r *http.Request) {
	all, err := h.s.Templates.List()
	if err != nil {
		h.s.fail(w, r, err)
		return
	}
	out := []templateBody{}
	for _, t := range all {
		if !t.Internal {
			out = append(out, toBody(t))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *templateHandlers) get(w http.ResponseWriter, r *http.Request) {
	t, err := h.lookup(r.PathValue("id"))
	if err != nil {
		h.s.fail(w, r, err)
		return
	}
	body := toBody(t)
	body.Builds, _ = h.b.Builds(t.ID)
	writeJSON(w, http.StatusOK, body)
}

// createAnswer is the answer of POST /templates.
type createAnswer struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Aliases    []string `json:"aliases"`
	State      string   `json:"state"`
}

// create starts a build. The body is a JSON BuildRequest, or (for a
// Dockerfile build with a context) multipart/form-data with the parts
// "request" (that JSON) and "context" (a tar of the build context).
func (h *templateHandlers) create(w http.ResponseWriter, r *http.Request) {
	var req template.BuildRequest
	contextDir := ""
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt == "multipart/form-data" {
		r.Body = http.MaxBytesReader(w, r.Body, maxContext)
		mr, err := r.MultipartReader()
		if err != nil {
			h.s.fail(w, r, fmt.Errorf("multipart body: %v: %w", err, errdefs.ErrInvalid))
			return
		}
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				h.s.fail(w, r, fmt.Errorf("multipart body: %v: %w", err, errdefs.ErrInvalid))
				os.RemoveAll(contextDir)
				return
			}
			switch part.FormName() {
			case "request":
				if err := json.NewDecoder(io.LimitReader(part, maxBody)).Decode(&req); err != nil {
					h.s.fail(w, r, fmt.Errorf("request part: %v: %w", err, errdefs.ErrInvalid))
					os.RemoveAll(contextDir)
					return
				}
			case "context":
				if contextDir != "" {
					continue
				}
				contextDir = h.b.Layers.NewTmp("context-")
				if err := image.Unpack(part, contextDir); err != nil {
					h.s.fail(w, r, fmt.Errorf("build context: %v: %w", err, errdefs.ErrInvalid))
					return
				}
			}
		}
	} else if err := decode(w, r, &req); err != nil {
		h.s.fail(w, r, err)
		return
	}
	if req.Dockerfile != "" && contextDir == "" {
		contextDir = h.b.Layers.NewTmp("context-")
		if err := os.Mkdir(contextDir, 0o700); err != nil {
			h.s.fail(w, r, err)
			return
		}
	}
	bd, err := h.b.Start(req, contextDir)
	if err != nil {
		h.s.fail(w, r, err)
		return
	}
	t, _ := h.s.Templates.Get(bd.TemplateID)
	aliases := t.Aliases
	if aliases == nil {
		aliases = []string{}
	}
	writeJSON(w, http.StatusAccepted, createAnswer{TemplateID: bd.TemplateID, BuildID: bd.BuildID, Aliases: aliases, State: bd.State})
}

func (h *templateHandlers) patch(w http.ResponseWriter, r *http.Request) {
	var p template.Patch
	if err := decode(w, r, &p); err != nil {
		h.s.fail(w, r, err)
		return
	}
	t, err := h.b.Update(context.WithoutCancel(r.Context()), r.PathValue("id"), p)
	if err != nil {
		h.s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toBody(t))
}

func (h *templateHandlers) delete(w http.ResponseWriter, r *http.Request) {
	// E2B's Sandbox.deleteSnapshot comes here with a snapshot id.
	if _, err := h.s.Sandboxes.GetSnapshot(r.PathValue("id")); err == nil {
		h.s.deleteSnapshot(w, r)
		return
	}
	if err := h.b.Delete(context.WithoutCancel(r.Context()), r.PathValue("id")); err != nil {
		h.s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// buildStatus is a build's status, with its log lines from logsOffset on
// (as E2B's build status carries them).
type buildStatus struct {
	template.Build
	Status string   `json:"status"` // E2B: building, ready, error
	Logs   []string `json:"logs"`
}

func (h *templateHandlers) build(r *http.Request) (template.Build, error) {
	t, err := h.lookup(r.PathValue("id"))
	if err != nil {
		return template.Build{}, err
	}
	return h.b.Status(t.ID, r.PathValue("buildID"))
}

func offset(r *http.Request, names ...string) (int, error) {
	for _, n := range names {
		if v := r.URL.Query().Get(n); v != "" {
			o, err := strconv.Atoi(v)
			if err != nil || o < 0 {
				return 0, fmt.Errorf("%s must be a non-negative integer: %w", n, errdefs.ErrInvalid)
			}
			return o, nil
		}
	}
	return 0, nil
}

func (h *templateHandlers) status(w http.ResponseWriter, r *http.Request) {
	bd, err := h.build(r)
	if err != nil {
		h.s.fail(w, r, err)
		return
	}
	off, err := offset(r, "logsOffset", "offset")
	if err != nil {
		h.s.fail(w, r, err)
		return
	}
	logs, _ := h.b.Logs(bd.TemplateID, bd.BuildID, off)
	status := map[string]string{template.StateReady: "ready", template.StateFailed: "error"}[bd.State]
	if status == "" {
		status = "building"
	}
	writeJSON(w, http.StatusOK, buildStatus{Build: bd, Status: status, Logs: logs})
}

func (h *templateHandlers) logs(w http.ResponseWriter, r *http.Request) {
	bd, err := h.build(r)
	if err != nil {
		h.s.fail(w, r, err)
		return
	}
	off, err := offset(r, "offset", "logsOffset")
	if err != nil {
		h.s.fail(w, r, err)
		return
	}
	logs, err := h.b.Logs(bd.TemplateID, bd.BuildID, off)
	if err != nil {
		h.s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"logs": logs, "offset": off, "next": off + len(logs)})
}

func (h *templateHandlers) alias(w http.ResponseWriter, r *http.Request) {
	a := r.PathValue("alias")
	t, err := h.lookup(a)
	if err == nil && !strings.EqualFold(t.ID, a) {
		found := false
		for _, x := range t.Aliases {
			found = found || x == a
		}
		if !found {
			err = fmt.Errorf("alias %q: %w", a, errdefs.ErrNotFound)
		}
	}
	if err != nil {
		h.s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"templateID": t.ID, "public": true})
}
