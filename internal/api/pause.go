package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/sandbox"
)

func (s *Server) pauseRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /sandboxes/{id}/pause", s.pauseSandbox)
	mux.HandleFunc("POST /sandboxes/{id}/resume", s.resumeSandbox)
	mux.HandleFunc("POST /v1/sandboxes/{id}/pause", s.pauseSandbox)
	mux.HandleFunc("POST /v1/sandboxes/{id}/resume", s.resumeSandbox)
	s.snapshotRoutes(mux)
	s.backupRoutes(mux)
}

// autoResumeBody is E2B's SandboxAutoResumeConfig.
type autoResumeBody struct {
	Enabled bool `json:"enabled"`
}

// lifecycle is the create body's autoPause, autoPauseMemory, autoResume.
func (b newSandboxBody) lifecycle() sandbox.Lifecycle {
	l := sandbox.Lifecycle{AutoPauseMemory: b.AutoPauseMemory}
	if b.AutoPause != nil {
		l.AutoPause = *b.AutoPause
	}
	if b.AutoResume != nil {
		l.AutoResume = b.AutoResume.Enabled
	}
	return l
}

// lifecycleBody is E2B's SandboxLifecycle in a sandbox's info.
type lifecycleBody struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"`
}

// pauseDetail is what a sandbox's info adds about pausing: the lifecycle
// and how it was (last) paused, with why memory was not kept.
type pauseDetail struct {
	Lifecycle lifecycleBody `json:"lifecycle"`
	PauseMode string        `json:"pauseMode,omitempty"`
	PauseNote string        `json:"pauseNote,omitempty"`
	PausedAt  *time.Time    `json:"pausedAt,omitempty"`
	Runtime   string        `json:"runtime"`
}

func pauseDetailOf(sb sandbox.Sandbox) pauseDetail {
	d := pauseDetail{
		Lifecycle: lifecycleBody{AutoResume: sb.AutoResume, OnTimeout: "kill"},
		PauseMode: sb.PauseMode, PauseNote: sb.PauseNote, PausedAt: sb.PausedAt, Runtime: sb.Runtime,
	}
	if sb.AutoPause {
		d.Lifecycle.OnTimeout = "pause"
	}
	if d.Runtime == "" {
		d.Runtime = "runc"
	}
	return d
}

// pauseBody is E2B's SandboxPauseRequest ({memory}); keepMemory is the
// SDK option's name, accepted too.
type pauseBody struct {
	Memory     *bool `json:"memory"`
	KeepMemory *bool `json:"keepMemory"`
}

// pauseSandbox answers 204 once the sandbox is paused, 409 when it was
// paused already. Memory is kept when asked (the default) and the
// sandbox's runtime can; otherwise the pause keeps the filesystem only and
// the sandbox's info says so (pauseMode, pauseNote).
func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) {
	var body pauseBody
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	keep := true
	if body.KeepMemory != nil {
		keep = *body.KeepMemory
	}
	if body.Memory != nil {
		keep = *body.Memory
	}
	sb, err := s.Sandboxes.Pause(context.WithoutCancel(r.Context()), r.PathValue("id"), keep)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.Header().Set("Nook-Pause-Mode", sb.PauseMode)
	w.WriteHeader(http.StatusNoContent)
}

// resumeBody is E2B's ResumedSandbox / ConnectSandbox.
type resumeBody struct {
	Timeout   *int64 `json:"timeout"`
	Memory    *bool  `json:"memory"`
	AutoPause *bool  `json:"autoPause"`
}

// resumeSandbox is the (deprecated in E2B) resume: 201 once resumed, 409
// when it runs already.
func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request) {
	s.connectOrResume(w, r, true)
}

// connectOrResume resumes a paused sandbox (201) or, for connect, extends
// a running one's end time (200).
func (s *Server) connectOrResume(w http.ResponseWriter, r *http.Request, strict bool) {
	var body resumeBody
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	var d time.Duration
	if body.Timeout != nil {
		secs, err := secondsField("timeout", *body.Timeout, true)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		d = secs
	} else if strict {
		d = 15 * time.Second // E2B's ResumedSandbox default
	}
	id := r.PathValue("id")
	for try := 0; ; try++ {
		sb, resumed, err := s.Sandboxes.Resume(context.WithoutCancel(r.Context()), id, d, body.Memory)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		if resumed {
			writeJSON(w, http.StatusCreated, s.sandboxBody(sb))
			return
		}
		if strict {
			s.fail(w, r, fmt.Errorf("sandbox %q is already running: %w", id, errdefs.ErrConflict))
			return
		}
		sb, err = s.Sandboxes.Extend(id, d)
		if err != nil && errors.Is(err, sandbox.ErrPaused) == false && errors.Is(err, errdefs.ErrConflict) && try == 0 {
			continue // paused between the two calls (auto-pause): resume it
		}
		if err != nil {
			s.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, s.sandboxBody(sb))
		return
	}
}

// failStored is fail for reads of stored state: corrupted data is 422.
func (s *Server) failStored(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, sandbox.ErrCorrupt) {
		writeError(w, http.StatusUnprocessableEntity, err.Error())
		return
	}
	s.fail(w, r, err)
}
