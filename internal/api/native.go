package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/nookhq/nook/internal/envmodel"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/native"
)

// nativeRoutes serves nook's native face under /v1 (Cloudflare Sandbox 1.0
// semantics: named sandboxes, exec with process handles, setEnvVars,
// terminals) and the OCI exec WebSocket of `nook exec`. Durations are in
// milliseconds.
func (s *Server) nativeRoutes(mux *http.ServeMux) {
	if s.Native == nil {
		return
	}
	mux.HandleFunc("PUT /v1/namespaces/{ns}/sandboxes/{name}", s.nativeGetSandbox)
	mux.HandleFunc("GET /v1/sandboxes/{id}", s.nativeSandboxInfo)
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", s.killSandbox)
	mux.HandleFunc("GET /v1/sandboxes/{id}/env", s.nativeGetEnv)
	mux.HandleFunc("POST /v1/sandboxes/{id}/env", s.nativeSetEnv)

	mux.HandleFunc("POST /v1/sandboxes/{id}/processes", s.nativeExec)
	mux.HandleFunc("GET /v1/sandboxes/{id}/processes", s.nativeListProcesses)
	mux.HandleFunc("GET /v1/sandboxes/{id}/processes/{pid}", s.nativeGetProcess)
	mux.HandleFunc("GET /v1/sandboxes/{id}/processes/{pid}/logs", s.nativeLogs("process"))
	mux.HandleFunc("GET /v1/sandboxes/{id}/processes/{pid}/output", s.nativeOutput)
	mux.HandleFunc("GET /v1/sandboxes/{id}/processes/{pid}/wait", s.nativeWait("process"))
	mux.HandleFunc("GET /v1/sandboxes/{id}/processes/{pid}/wait-for-log", s.nativeWaitForLog)
	mux.HandleFunc("GET /v1/sandboxes/{id}/processes/{pid}/wait-for-port", s.nativeWaitForPort)
	mux.HandleFunc("POST /v1/sandboxes/{id}/processes/{pid}/kill", s.nativeKill)

	mux.HandleFunc("POST /v1/sandboxes/{id}/terminals", s.nativeCreateTerminal)
	mux.HandleFunc("GET /v1/sandboxes/{id}/terminals", s.nativeListTerminals)
	mux.HandleFunc("GET /v1/sandboxes/{id}/terminals/{pid}", s.nativeGetTerminal)
	mux.HandleFunc("POST /v1/sandboxes/{id}/terminals/{pid}/write", s.nativeWrite)
	mux.HandleFunc("POST /v1/sandboxes/{id}/terminals/{pid}/resize", s.nativeResize)
	mux.HandleFunc("GET /v1/sandboxes/{id}/terminals/{pid}/output", s.nativeLogs("terminal"))
	mux.HandleFunc("GET /v1/sandboxes/{id}/terminals/{pid}/wait", s.nativeWait("terminal"))
	mux.HandleFunc("POST /v1/sandboxes/{id}/terminals/{pid}/interrupt", s.nativeInterrupt)
	mux.HandleFunc("POST /v1/sandboxes/{id}/terminals/{pid}/terminate", s.nativeTerminate)
	mux.HandleFunc("GET /v1/sandboxes/{id}/terminals/{pid}/ws", s.nativeAttach)

	mux.HandleFunc("GET /v1/sandboxes/{id}/oci-exec", s.nativeOCIExec)
}

// nativeFail is fail plus the native face's own error kinds.
func (s *Server) nativeFail(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, native.ErrTimeout) {
		writeError(w, http.StatusGatewayTimeout, err.Error())
		return
	}
	if errors.Is(err, context.Canceled) {
		return // the client went away
	}
	s.fail(w, r, err)
}

// millis reads an optional non-negative duration in milliseconds from the query.
func millis(r *http.Request, name string) (time.Duration, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s %q: want milliseconds >= 0: %w", name, v, errdefs.ErrInvalid)
	}
	return time.Duration(n) * time.Millisecond, nil
}

func cursorParam(r *http.Request) (*uint64, error) {
	v := r.URL.Query().Get("since")
	if v == "" {
		return nil, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("since %q: want a cursor: %w", v, errdefs.ErrInvalid)
	}
	return &n, nil
}

func boolParam(r *http.Request, name string, def bool) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%s %q: want true or false: %w", name, v, errdefs.ErrInvalid)
	}
	return b, nil
}

type namedSandboxBody struct {
	Template string            `json:"template"`
	Timeout  *int64            `json:"timeout"` // seconds
	EnvVars  map[string]string `json:"envVars"`
}

type nativeSandbox struct {
	ID         string            `json:"id"`
	Namespace  string            `json:"namespace,omitempty"`
	Name       string            `json:"name,omitempty"`
	TemplateID string            `json:"templateID"`
	Created    bool              `json:"created"`
	StartedAt  time.Time         `json:"startedAt"`
	EndAt      time.Time         `json:"endAt"`
	Metadata   map[string]string `json:"metadata,omitempty"`
}

func (s *Server) nativeGetSandbox(w http.ResponseWriter, r *http.Request) {
	var body namedSandboxBody
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	var o native.GetOptions
	o.Template, o.EnvVars = body.Template, body.EnvVars
	if body.Timeout != nil {
		secs, err := secondsField("timeout", *body.Timeout, false)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		o.Timeout = secs
	}
	sb, created, err := s.Native.GetSandbox(r.Context(), r.PathValue("ns"), r.PathValue("name"), o)
	if err != nil {
		s.nativeFail(w, r, err)
		return
	}
	code := http.StatusOK
	if created {
		code = http.StatusCreated
	}
	writeJSON(w, code, nativeSandbox{ID: sb.ID, Namespace: sb.Metadata[native.MetaNamespace], Name: sb.Metadata[native.MetaName],
		TemplateID: sb.TemplateID, Created: created, StartedAt: sb.StartedAt, EndAt: sb.EndAt, Metadata: sb.Metadata})
}

func (s *Server) nativeSandboxInfo(w http.ResponseWriter, r *http.Request) {
	sb, err := s.Sandboxes.Get(r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, nativeSandbox{ID: sb.ID, Namespace: sb.Metadata[native.MetaNamespace], Name: sb.Metadata[native.MetaName],
		TemplateID: sb.TemplateID, StartedAt: sb.StartedAt, EndAt: sb.EndAt, Metadata: sb.Metadata})
}

func (s *Server) nativeGetEnv(w http.ResponseWriter, r *http.Request) {
	env, err := s.Native.EnvVars(r.PathValue("id"))
	if err != nil {
		s.nativeFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, env)
}

func (s *Server) nativeSetEnv(w http.ResponseWriter, r *http.Request) {
	var body envmodel.Launch
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	env, err := s.Native.SetEnvVars(r.PathValue("id"), body)
	if err != nil {
		s.nativeFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, env)
}

type execBody struct {
	Command []string        `json:"command"`
	Cwd     string          `json:"cwd"`
	Env     envmodel.Launch `json:"env"`
	Timeout int64           `json:"timeout"` // ms; 0: none
}

func (s *Server) nativeExec(w http.ResponseWriter, r *http.Request) {
	var body execBody
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	if body.Timeout < 0 {
		s.fail(w, r, fmt.Errorf("timeout must not be negative: %w", errdefs.ErrInvalid))
		return
	}
	info, err := s.Native.Exec(r.PathValue("id"), body.Command, native.ExecOptions{
		Cwd: body.Cwd, Env: body.Env, Timeout: time.Duration(body.Timeout) * time.Millisecond,
	})
	if err != nil {
		s.nativeFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, info)
}

func (s *Server) nativeListProcesses(w http.ResponseWriter, r *http.Request) {
	list, err := s.Native.ListProcesses(r.PathValue("id"))
	if err != nil {
		s.nativeFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) nativeGetProcess(w http.ResponseWriter, r *http.Request) {
	info, err := s.Native.GetProcess(r.PathValue("id"), r.PathValue("pid"))
	if err != nil {
		s.nativeFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

// nativeLogs answers one LogChunk, or with follow=true streams LogChunks as
// NDJSON until the process ends (the last one has "end").
func (s *Server) nativeLogs(kind string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var o native.LogsOptions
		var err error
		if o.Since, err = cursorParam(r); err == nil {
			if o.Replay, err = boolParam(r, "replay", true); err == nil {
				o.Follow, err = boolParam(r, "follow", false)
			}
		}
		o.Stream = r.URL.Query().Get("stream")
		if err == nil && o.Stream != "" && o.Stream != "stdout" && o.Stream != "stderr" && o.Stream != "pty" {
			err = fmt.Errorf("stream %q: want stdout or stderr: %w", o.Stream, errdefs.ErrInvalid)
		}
		if err != nil {
			s.fail(w, r, err)
			return
		}
		id, pid := r.PathValue("id"), r.PathValue("pid")
		// Resolve first so that unknown ids get a clean 404.
		if kind == "process" {
			_, err = s.Native.GetProcess(id, pid)
		} else {
			_, err = s.Native.GetTerminal(id, pid)
		}
		if err != nil {
			s.nativeFail(w, r, err)
			return
		}
		started := false
		flusher, _ := w.(http.Flusher)
		err = s.Native.Logs(r.Context(), id, kind, pid, o, func(ch native.LogChunk) error {
			if ch.Events == nil {
				ch.Events = []native.Event{}
			}
			if !o.Follow {
				writeJSON(w, http.StatusOK, ch)
				return nil
			}
			if !started {
				w.Header().Set("Content-Type", "application/x-ndjson")
				w.WriteHeader(http.StatusOK)
				started = true
			}
			if err := json.NewEncoder(w).Encode(ch); err != nil {
				return err
			}
			if flusher != nil {
				flusher.Flush()
			}
			return nil
		})
		if o.Follow && !started && err == nil && r.Context().Err() == nil {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			return
		}
		if err != nil && !started {
			s.nativeFail(w, r, err)
		}
	}
}

func (s *Server) nativeOutput(w http.ResponseWriter, r *http.Request) {
	timeout, err := millis(r, "timeout")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	maxBytes := 0
	if v := r.URL.Query().Get("maxBytes"); v != "" {
		if maxBytes, err = strconv.Atoi(v); err != nil || maxBytes < 0 {
			s.fail(w, r, fmt.Errorf("maxBytes %q: want a number >= 0: %w", v, errdefs.ErrInvalid))
			return
		}
	}
	out, err := s.Native.Output(r.Context(), r.PathValue("id"), r.PathValue("pid"), native.OutputOptions{MaxBytes: maxBytes, Timeout: timeout})
	if err != nil {
		s.nativeFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) nativeWait(kind string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		timeout, err := millis(r, "timeout")
		if err != nil {
			s.fail(w, r, err)
			return
		}
		info, err := s.Native.Wait(r.Context(), r.PathValue("id"), kind, r.PathValue("pid"), timeout)
		if err != nil {
			s.nativeFail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, info)
	}
}

func (s *Server) nativeWaitForLog(w http.ResponseWriter, r *http.Request) {
	timeout, err := millis(r, "timeout")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	since, err := cursorParam(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	q := r.URL.Query()
	m, err := s.Native.WaitForLog(r.Context(), r.PathValue("id"), r.PathValue("pid"), q.Get("pattern"), q.Get("stream"), since, timeout)
	if err != nil {
		s.nativeFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, m)
}

func (s *Server) nativeWaitForPort(w http.ResponseWriter, r *http.Request) {
	timeout, err := millis(r, "timeout")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	port, err := strconv.Atoi(r.URL.Query().Get("port"))
	if err != nil {
		s.fail(w, r, fmt.Errorf("port %q: want a number: %w", r.URL.Query().Get("port"), errdefs.ErrInvalid))
		return
	}
	if err := s.Native.WaitForPort(r.Context(), r.PathValue("id"), r.PathValue("pid"), port, timeout); err != nil {
		s.nativeFail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) nativeKill(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Signal int `json:"signal"`
	}
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.Native.Kill(r.Context(), r.PathValue("id"), r.PathValue("pid"), body.Signal); err != nil {
		s.nativeFail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

type terminalBody struct {
	Command    []string        `json:"command"`
	Cwd        string          `json:"cwd"`
	Env        envmodel.Launch `json:"env"`
	Cols       int             `json:"cols"`
	Rows       int             `json:"rows"`
	BufferSize int             `json:"bufferSize"`
}

func (s *Server) nativeCreateTerminal(w http.ResponseWriter, r *http.Request) {
	var body terminalBody
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	info, err := s.Native.CreateTerminal(r.PathValue("id"), native.TerminalOptions{
		Command: body.Command, Cwd: body.Cwd, Env: body.Env, Cols: body.Cols, Rows: body.Rows, BufferSize: body.BufferSize,
	})
	if err != nil {
		s.nativeFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, info)
}

func (s *Server) nativeListTerminals(w http.ResponseWriter, r *http.Request) {
	list, err := s.Native.ListTerminals(r.PathValue("id"))
	if err != nil {
		s.nativeFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) nativeGetTerminal(w http.ResponseWriter, r *http.Request) {
	info, err := s.Native.GetTerminal(r.PathValue("id"), r.PathValue("pid"))
	if err != nil {
		s.nativeFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

// nativeWrite sends the raw request body to a terminal as input.
func (s *Server) nativeWrite(w http.ResponseWriter, r *http.Request) {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		s.fail(w, r, fmt.Errorf("input larger than %d bytes: %w", maxBody, err))
		return
	}
	if err := s.Native.Write(r.Context(), r.PathValue("id"), r.PathValue("pid"), data); err != nil {
		s.nativeFail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) nativeResize(w http.ResponseWriter, r *http.Request) {
	var body struct{ Cols, Rows int }
	if err := decode(w, r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.Native.Resize(r.Context(), r.PathValue("id"), r.PathValue("pid"), body.Cols, body.Rows); err != nil {
		s.nativeFail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) nativeInterrupt(w http.ResponseWriter, r *http.Request) {
	if err := s.Native.Interrupt(r.Context(), r.PathValue("id"), r.PathValue("pid")); err != nil {
		s.nativeFail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) nativeTerminate(w http.ResponseWriter, r *http.Request) {
	if err := s.Native.Terminate(r.Context(), r.PathValue("id"), r.PathValue("pid")); err != nil {
		s.nativeFail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) nativeAttach(w http.ResponseWriter, r *http.Request) {
	if err := s.Native.Attach(w, r, r.PathValue("id"), r.PathValue("pid")); err != nil {
		s.nativeFail(w, r, err)
	}
}

func (s *Server) nativeOCIExec(w http.ResponseWriter, r *http.Request) {
	if err := s.Native.ServeOCIExec(w, r, r.PathValue("id")); err != nil {
		s.nativeFail(w, r, err)
	}
}
