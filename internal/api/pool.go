package api

import "net/http"

// poolRoutes serves nook's own view of the warm pools.
func (s *Server) poolRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/pool", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.Sandboxes.PoolSizes())
	})
}
