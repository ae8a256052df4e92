package docker

import (
	"net/http"

	"github.com/moby/moby/api/types/container"
)

// routes serves the Docker API subset (docs/docker.md lists it).
func (s *Server) routes() {
	for pattern, h := range s.handlers() {
		s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			if err := s.authorize(r, pattern); err != nil {
				refuse(w, r, err)
				return
			}
			h(w, r)
		})
	}
}

// handlers are the routes by pattern; each has its needs (auth.go).
func (s *Server) handlers() map[string]http.HandlerFunc {
	return map[string]http.HandlerFunc{
		"GET /_ping":                    s.ping,
		"HEAD /_ping":                   s.ping,
		"GET /version":                  s.version,
		"GET /info":                     s.info,
		"GET /events":                   s.systemEvents,
		"GET /networks":                 s.networkList,
		"GET /networks/{id}":            s.networkInspect,
		"POST /networks/create":         s.networkCreate,
		"GET /images/json":              s.imageList,
		"GET /images/{name...}":         s.imageRoute,
		"POST /images/create":           s.imagePull,
		"POST /containers/create":       s.containerCreate,
		"GET /containers/json":          s.containerList,
		"GET /containers/{id}/json":     s.containerInspect,
		"POST /containers/{id}/start":   s.containerStart,
		"POST /containers/{id}/wait":    s.containerWait,
		"GET /containers/{id}/logs":     s.containerLogs,
		"POST /containers/{id}/attach":  s.containerAttach,
		"POST /containers/{id}/resize":  s.containerResize,
		"POST /containers/{id}/kill":    s.containerKill,
		"POST /containers/{id}/stop":    s.containerStop,
		"POST /containers/{id}/restart": s.containerRestart,
		"DELETE /containers/{id}":       s.containerRemove,
		"GET /containers/{id}/top":      s.containerTop,
		"GET /containers/{id}/stats":    s.containerStats,
		"HEAD /containers/{id}/archive": s.archiveHead,
		"GET /containers/{id}/archive":  s.archiveGet,
		"PUT /containers/{id}/archive":  s.archivePut,
		"POST /containers/{id}/exec":    s.execCreate,
		"POST /exec/{id}/start":         s.execStart,
		"POST /exec/{id}/resize":        s.execResize,
		"GET /exec/{id}/json":           s.execInspect,
	}
}

// imageRoute serves GET /images/{name}/json, where the name may hold
// slashes (registry/repo:tag).
func (s *Server) imageRoute(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	const suffix = "/json"
	if len(name) <= len(suffix) || name[len(name)-len(suffix):] != suffix {
		writeError(w, notFoundPath(r))
		return
	}
	r.SetPathValue("name", name[:len(name)-len(suffix)])
	s.imageInspect(w, r)
}

// containerTop lists the container's command: the processes of a task are
// not listed one by one.
func (s *Server) containerTop(w http.ResponseWriter, r *http.Request) {
	c, err := s.lookup(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	if !c.running() {
		writeError(w, errNotRunning(c))
		return
	}
	if s.onLambda(c) {
		writeError(w, notOnLambda(c, "list its processes"))
		return
	}
	writeJSON(w, http.StatusOK, container.TopResponse{Titles: []string{"PID", "CMD"},
		Processes: [][]string{{"-", joinArgv(c.argv())}}})
}
