package agent

import (
	"encoding/json"
	"net/http"
	"syscall"

	"github.com/nookhq/nook/internal/agentwire"
	pb "github.com/nookhq/nook/internal/envdpb/process"
	"github.com/nookhq/nook/internal/envmodel"
)

// This file holds the agent's side of nook's native face (exec/terminals):
// nook serve derives the full environment of a native launch with envmodel
// and asks the agent to use exactly that (agentwire.LaunchEnvHeader), and
// signals processes with any signal (POST /nook/signal). Both are reachable
// only from nook serve: the proxy strips the header and refuses the prefix.

// startEnv derives a Start request's environment: exactly the request's envs
// when nook serve asked for that, else the envd rules (envmodel.Envd).
func (s *Server) startEnv(h http.Header, u *User, envs map[string]string) []string {
	if h.Get(agentwire.LaunchEnvHeader) == agentwire.LaunchEnvExact {
		return envmodel.Env(envs).List()
	}
	return ProcessEnv(s.cfg.AgentEnv, s.cfg.InheritImageEnv, u, s.sandboxEnv(), envs)
}

// nativeRoutes registers the routes reserved for nook serve.
func (s *Server) nativeRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST "+agentwire.ControlPrefix+"signal", s.handleSignal)
}

// SignalRequest is the body of POST /nook/signal: send Signal to the process
// group of the process Pid started through the process service.
type SignalRequest struct {
	Pid    uint32 `json:"pid"`
	Signal int    `json:"signal"`
}

func (s *Server) handleSignal(w http.ResponseWriter, r *http.Request) {
	var req SignalRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON: "+err.Error())
		return
	}
	if req.Signal < 1 || req.Signal > 64 {
		writeError(w, http.StatusBadRequest, "signal must be 1..64")
		return
	}
	p, err := s.procs.get(&pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: req.Pid}})
	if err != nil {
		writeError(w, http.StatusNotFound, err.Error())
		return
	}
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	if exited {
		writeError(w, http.StatusConflict, "process has exited")
		return
	}
	if err := p.signal(syscall.Signal(req.Signal)); err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
