package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/sandbox"
)

func (s *Server) snapshotRoutes(mux *http.ServeMux) {
	// E2B face.
	mux.HandleFunc("POST /sandboxes/{id}/snapshots", s.createSnapshotE2B)
	mux.HandleFunc("GET /snapshots", s.listSnapshotsE2B)
	mux.HandleFunc("POST /sandboxes/{id}/fork", s.forkSandbox)
	// Native face.
	mux.HandleFunc("POST /v1/sandboxes/{id}/snapshots", s.createSnapshot)
	mux.HandleFunc("GET /v1/snapshots", s.listSnapshots)
	mux.HandleFunc("GET /v1/snapshots/{sid}", s.getSnapshot)
	mux.HandleFunc("DELETE /v1/snapshots/{sid}", s.deleteSnapshot)
	mux.HandleFunc("POST /v1/sandboxes/{id}/rollback", s.rollbackSandbox)
	mux.HandleFunc("POST /v1/sandboxes/{id}/clone", s.cloneSandbox)
}

// snapshotInfo is E2B's SnapshotInfo.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

type snapshotRequest struct {
	Name string `json:"name"`
}

func (s *Server) takeSnapshot(w http.ResponseWriter, r *http.Request) (sandbox.Snapshot, bool) {
	var body snapshotRequest
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return sandbox.Snapshot{}, false
	}
	snap, err := s.Sandboxes.CreateSnapshot(context.WithoutCancel(r.Context()), r.PathValue("id"), body.Name)
	if err != nil {
		s.fail(w, r, err)
		return snap, false
	}
	return snap, true
}

func (s *Server) createSnapshotE2B(w http.ResponseWriter, r *http.Request) {
	if snap, ok := s.takeSnapshot(w, r); ok {
		writeJSON(w, http.StatusCreated, snapshotInfo{SnapshotID: snap.ID, Names: []string{snap.ID}})
	}
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	if snap, ok := s.takeSnapshot(w, r); ok {
		writeJSON(w, http.StatusCreated, snap)
	}
}

// filteredSnapshots applies ?sandboxID= and ?name= and pages with
// limit/nextToken (the id of the next page's first snapshot).
func (s *Server) filteredSnapshots(w http.ResponseWriter, r *http.Request) ([]sandbox.Snapshot, bool) {
	all, err := s.Sandboxes.ListSnapshots()
	if err != nil {
		s.fail(w, r, err)
		return nil, false
	}
	q := r.URL.Query()
	var out []sandbox.Snapshot
	for _, sn := range all {
		if v := q.Get("sandboxID"); v != "" && sn.SandboxID != v {
			continue
		}
		if v := q.Get("name"); v != "" && sn.ID != v {
			continue
		}
		out = append(out, sn)
	}
	limit := len(out)
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			s.fail(w, r, fmt.Errorf("limit must be 1..1000: %w", errdefs.ErrInvalid))
			return nil, false
		}
		limit = n
	}
	start := 0
	if tok := q.Get("nextToken"); tok != "" {
		start = len(out)
		for i, sn := range out {
			if sn.ID == tok {
				start = i
			}
		}
	}
	end := min(start+limit, len(out))
	if end < len(out) {
		w.Header().Set("X-Next-Token", out[end].ID)
	}
	return out[start:end], true
}

func (s *Server) listSnapshotsE2B(w http.ResponseWriter, r *http.Request) {
	list, ok := s.filteredSnapshots(w, r)
	if !ok {
		return
	}
	out := make([]snapshotInfo, 0, len(list))
	for _, sn := range list {
		out = append(out, snapshotInfo{SnapshotID: sn.ID, Names: []string{sn.ID}})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	list, ok := s.filteredSnapshots(w, r)
	if !ok {
		return
	}
	if list == nil {
		list = []sandbox.Snapshot{}
	}
	writeJSON(w, http.StatusOK, list)
}

// getSnapshot answers a snapshot's record; ?verify=true recomputes its
// digest first and answers 422 when the stored layer does not match.
func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("sid")
	snap, err := s.Sandboxes.GetSnapshot(id)
	if err == nil && r.URL.Query().Get("verify") == "true" {
		err = s.Sandboxes.VerifySnapshot(id)
	}
	if err != nil {
		s.failStored(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, snap)
}

// deleteSnapshot serves DELETE /v1/snapshots/{sid} and, for E2B's
// Sandbox.deleteSnapshot, DELETE /templates/{id} with a snapshot's id.
func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("sid")
	if id == "" {
		id = r.PathValue("id")
	}
	if err := s.Sandboxes.DeleteSnapshot(id); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) rollbackSandbox(w http.ResponseWriter, r *http.Request) {
	var body struct {
		SnapshotID string `json:"snapshotID"`
	}
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	if body.SnapshotID == "" {
		s.fail(w, r, fmt.Errorf("snapshotID is required: %w", errdefs.ErrInvalid))
		return
	}
	sb, err := s.Sandboxes.Rollback(context.WithoutCancel(r.Context()), r.PathValue("id"), body.SnapshotID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.detail(sb, true))
}

// forkResult is E2B's SandboxForkResult.
type forkResult struct {
	Sandbox *sandboxBody `json:"sandbox,omitempty"`
	Error   *apiError    `json:"error,omitempty"`
}

type cloneRequest struct {
	Count   *int   `json:"count"`
	Timeout *int64 `json:"timeout"`
}

func (s *Server) clone(w http.ResponseWriter, r *http.Request, defTimeout time.Duration) {
	var body cloneRequest
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	count, timeout := 1, defTimeout
	if body.Count != nil {
		count = *body.Count
	}
	if body.Timeout != nil {
		secs, err := secondsField("timeout", *body.Timeout, false)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		timeout = secs
	}
	res, err := s.Sandboxes.Clone(context.WithoutCancel(r.Context()), r.PathValue("id"), count, timeout)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]forkResult, 0, len(res))
	for _, c := range res {
		if c.Err != nil {
			out = append(out, forkResult{Error: &apiError{Code: statusOf(c.Err), Message: c.Err.Error()}})
			continue
		}
		b := s.sandboxBody(c.Sandbox)
		out = append(out, forkResult{Sandbox: &b})
	}
	writeJSON(w, http.StatusCreated, out)
}

// forkSandbox is E2B's fork (timeout default 15 s there).
func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request) {
	s.clone(w, r, 15*time.Second)
}

func (s *Server) cloneSandbox(w http.ResponseWriter, r *http.Request) {
	s.clone(w, r, 0)
}

// statusOf is the HTTP status fail answers for err.
func statusOf(err error) int {
	switch {
	case errors.Is(err, errdefs.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, errdefs.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, errdefs.ErrConflict):
		return http.StatusConflict
	case errors.Is(err, errdefs.ErrUnavailable):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}
