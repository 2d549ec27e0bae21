// Package api serves nook's REST API: the E2B-compatible control plane
// (and, beside it, nook's own /v1 API). Errors become HTTP codes here only.
package api

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/native"
	"github.com/nookhq/nook/internal/sandbox"
	"github.com/nookhq/nook/internal/template"
)

// maxSeconds bounds every duration a request gives in seconds, so no value
// can overflow time.Duration (the sandbox manager's own limits are lower).
const maxSeconds = 10 * 365 * 24 * 3600

// secondsField turns a request's number of seconds into a duration: positive
// (or zero when zeroOK) and at most maxSeconds, or an ErrInvalid naming field.
func secondsField(field string, v int64, zeroOK bool) (time.Duration, error) {
	if v < 0 || (v == 0 && !zeroOK) || v > maxSeconds {
		want := "a positive"
		if zeroOK {
			want = "a non-negative"
		}
		return 0, fmt.Errorf("%s must be %s number of seconds, at most %d: %w", field, want, maxSeconds, errdefs.ErrInvalid)
	}
	return time.Duration(v) * time.Second, nil
}

// maxBody bounds every JSON request body.
const maxBody = 1 << 20

// Server is the REST API.
type Server struct {
	Sandboxes *sandbox.Manager
	Templates *template.Registry
	APIKeys   []string
	// Domain is returned to SDKs, which then address sandboxes as
	// {port}-{id}.{Domain}.
	Domain string
	Log    *slog.Logger
	// Native serves the native /v1 face (exec, terminals, OCI exec); nil: off.
	Native *native.Service
}

// Handler returns the API's HTTP handler.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	s.sandboxRoutes(mux)
	s.pauseRoutes(mux)
	s.templateRoutes(mux)
	s.networkRoutes(mux)
	s.poolRoutes(mux)
	s.nativeRoutes(mux)
	return s.authenticate(mux)
}

func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			next.ServeHTTP(w, r)
			return
		}
		key := r.Header.Get("X-API-Key")
		if key == "" {
			if auth := r.Header.Get("Authorization"); strings.HasPrefix(auth, "Bearer ") {
				key = strings.TrimPrefix(auth, "Bearer ")
			}
		}
		if !s.validKey(key) {
			writeError(w, http.StatusUnauthorized, "missing or invalid API key (header X-API-Key)")
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) validKey(key string) bool {
	if key == "" {
		return false
	}
	ok := false
	for _, k := range s.APIKeys {
		if subtle.ConstantTimeCompare([]byte(k), []byte(key)) == 1 {
			ok = true
		}
	}
	return ok
}

// apiError is the error body of every failed request.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, apiError{Code: code, Message: msg})
}

// fail turns an error into its HTTP status: the one place that does.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	code := http.StatusInternalServerError
	var maxErr *http.MaxBytesError
	switch {
	case errors.Is(err, errdefs.ErrInvalid):
		code = http.StatusBadRequest
	case errors.Is(err, errdefs.ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, errdefs.ErrConflict):
		code = http.StatusConflict
	case errors.Is(err, errdefs.ErrUnavailable):
		code = http.StatusServiceUnavailable
	case errors.As(err, &maxErr):
		code = http.StatusRequestEntityTooLarge
	}
	if code == http.StatusInternalServerError {
		s.Log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeError(w, code, err.Error())
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// decode reads a JSON body of at most maxBody bytes into v. An empty body
// leaves v as it is.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	body := http.MaxBytesReader(w, r.Body, maxBody)
	err := json.NewDecoder(body).Decode(v)
	var maxErr *http.MaxBytesError
	switch {
	case err == nil, errors.Is(err, io.EOF):
		return nil
	case errors.As(err, &maxErr):
		return fmt.Errorf("request body larger than %d bytes: %w", maxBody, err)
	default:
		return fmt.Errorf("malformed JSON body: %v: %w", err, errdefs.ErrInvalid)
	}
}
