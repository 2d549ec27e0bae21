package api

import (
	"context"
	"net/http"

	"github.com/nookhq/nook/internal/sandbox"
)

// Backups, the Cloudflare face: createBackup / restoreBackup.
func (s *Server) backupRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/sandboxes/{id}/backups", s.createBackup)
	mux.HandleFunc("GET /v1/sandboxes/{id}/backups", s.listBackups)
	mux.HandleFunc("POST /v1/sandboxes/{id}/backups/{bid}/restore", s.restoreBackup)
	mux.HandleFunc("GET /v1/backups", s.listBackups)
	mux.HandleFunc("GET /v1/backups/{bid}", s.getBackup)
	mux.HandleFunc("DELETE /v1/backups/{bid}", s.deleteBackup)
}

// backupRequest is createBackup's options; ttl is in seconds.
type backupRequest struct {
	Dir       string   `json:"dir"`
	Name      string   `json:"name"`
	TTL       *int64   `json:"ttl"`
	Excludes  []string `json:"excludes"`
	Gitignore bool     `json:"gitignore"`
}

func (s *Server) createBackup(w http.ResponseWriter, r *http.Request) {
	var body backupRequest
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	o := sandbox.BackupOptions{Dir: body.Dir, Name: body.Name, Excludes: body.Excludes, Gitignore: body.Gitignore}
	if body.TTL != nil {
		secs, err := secondsField("ttl", *body.TTL, false)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		o.TTL = secs
	}
	b, err := s.Sandboxes.CreateBackup(context.WithoutCancel(r.Context()), r.PathValue("id"), o)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, b)
}

func (s *Server) listBackups(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if id == "" {
		id = r.URL.Query().Get("sandboxID")
	}
	list, err := s.Sandboxes.ListBackups(id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if list == nil {
		list = []sandbox.Backup{}
	}
	writeJSON(w, http.StatusOK, list)
}

// getBackup answers a backup's record; ?verify=true checks its archive's
// digest first (422 when it does not match).
func (s *Server) getBackup(w http.ResponseWriter, r *http.Request) {
	b, err := s.Sandboxes.GetBackup(r.PathValue("bid"))
	if err == nil && r.URL.Query().Get("verify") == "true" {
		err = s.Sandboxes.VerifyBackup(r.Context(), b)
	}
	if err != nil {
		s.failStored(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, b)
}

func (s *Server) deleteBackup(w http.ResponseWriter, r *http.Request) {
	if err := s.Sandboxes.DeleteBackup(r.PathValue("bid")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// restoreBackup extracts backup bid into sandbox id (any sandbox, not only
// the one backed up), at body.dir or the backup's own dir.
func (s *Server) restoreBackup(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Dir string `json:"dir"`
	}
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	b, err := s.Sandboxes.RestoreBackup(context.WithoutCancel(r.Context()), r.PathValue("bid"), r.PathValue("id"), body.Dir)
	if err != nil {
		s.failStored(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, b)
}
