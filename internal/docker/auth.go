package docker

import (
	"net/http"
	"strconv"
	"strings"

	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/gateway"
)

// need is what one route asks of the namespace's Runs: verb on the
// resource runs (or its subresource), on the container the path names
// (container: the {id}; exec: the exec's container) or, with neither,
// on the namespace. An empty verb: the caller need only be
// authenticated (the version, the images table).
type need struct {
	verb, subresource string
	container, exec   bool
	// ifQuery, when set, names the query parameter whose true value
	// makes this need apply (attach's stdin writes to the process, as
	// exec does).
	ifQuery string
}

// needs are the Kubernetes RBAC rules on stoke.dev's runs that each route
// asks for, as the gateway's own routes do (docs/docker.md, "On
// Kubernetes"). A route missing here is refused (authorize): a new route
// is authorised before anyone can use it.
var needs = map[string][]need{
	"GET /_ping":            nil,
	"HEAD /_ping":           nil,
	"GET /version":          nil,
	"GET /images/json":      nil,
	"GET /images/{name...}": nil,
	"POST /images/create":   nil,
	// The one network, bridge, is no one's; creating one is refused.
	"GET /networks":         nil,
	"GET /networks/{id}":    nil,
	"POST /networks/create": nil,
	"GET /info":             {{verb: "list"}},
	"GET /containers/json":  {{verb: "list"}},
	"GET /events":           {{verb: "watch"}},
	// create makes the container's Run, held until start; its name is
	// the Run's.
	"POST /containers/create":   {{verb: "create"}},
	"GET /containers/{id}/json": {{verb: "get", container: true}},
	"GET /containers/{id}/top":  {{verb: "get", container: true}},
	// stats reads the task's usage with a script of the server's own.
	"GET /containers/{id}/stats": {{verb: "get", container: true}},
	"POST /containers/{id}/wait": {{verb: "get", container: true}},
	// start clears the held Run's spec.held.
	"POST /containers/{id}/start":   {{verb: "update", container: true}},
	"GET /containers/{id}/logs":     {{verb: "get", subresource: "log", container: true}},
	"POST /containers/{id}/attach":  {{verb: "get", subresource: "log", container: true}, {verb: "create", subresource: "exec", container: true, ifQuery: "stdin"}},
	"POST /containers/{id}/resize":  {{verb: "create", subresource: "exec", container: true}},
	"POST /containers/{id}/kill":    {{verb: "update", container: true}},
	"POST /containers/{id}/stop":    {{verb: "update", container: true}},
	"POST /containers/{id}/restart": {{verb: "delete", container: true}, {verb: "create", container: true}, {verb: "update", container: true}},
	"DELETE /containers/{id}":       {{verb: "delete", container: true}},
	"HEAD /containers/{id}/archive": {{verb: "create", subresource: "exec", container: true}},
	"GET /containers/{id}/archive":  {{verb: "create", subresource: "exec", container: true}},
	"PUT /containers/{id}/archive":  {{verb: "create", subresource: "exec", container: true}},
	"POST /containers/{id}/exec":    {{verb: "create", subresource: "exec", container: true}},
	"POST /exec/{id}/start":         {{verb: "create", subresource: "exec", exec: true}},
	"POST /exec/{id}/resize":        {{verb: "create", subresource: "exec", exec: true}},
	"GET /exec/{id}/json":           {{verb: "get", exec: true}},
}

// authorize asks Config.Auth whether r's caller may do what the route of
// pattern does, before the route runs: nothing of a refused request
// reaches a Run. Without Auth (standalone: the socket's 0700 directory
// is the authentication) everything is allowed.
func (s *Server) authorize(r *http.Request, pattern string) error {
	if s.cfg.Auth == nil {
		return nil
	}
	ns, ok := needs[pattern]
	switch {
	case pattern == "":
		// Who may learn which paths exist: anyone authenticated.
		return s.cfg.Auth.Authorize(r, gateway.Access{})
	case !ok:
		return errdefs.Errorf(errdefs.ErrPermissionDenied, "%s is not authorised on this server", pattern)
	}
	if len(ns) == 0 {
		return s.cfg.Auth.Authorize(r, gateway.Access{})
	}
	for _, n := range ns {
		if n.ifQuery != "" {
			if v, _ := strconv.ParseBool(r.URL.Query().Get(n.ifQuery)); !v {
				continue
			}
		}
		a := gateway.Access{Verb: n.verb, Resource: "runs", Subresource: n.subresource, Namespace: s.cfg.Namespace}
		switch {
		case n.container:
			a.Name = s.runName(r.PathValue("id"))
		case n.exec:
			a.Name = s.execRunName(r.PathValue("id"))
		case pattern == "POST /containers/create":
			a.Name = strings.TrimPrefix(r.URL.Query().Get("name"), "/")
		}
		if err := s.cfg.Auth.Authorize(r, a); err != nil {
			return err
		}
	}
	return nil
}

// refuse answers a request its caller may not make. A refused /_ping
// still names the API version: Docker's CLI would otherwise fall back to
// API 1.24 and show that version's refusal instead of this one.
func refuse(w http.ResponseWriter, r *http.Request, err error) {
	if strings.HasSuffix(r.URL.Path, "/_ping") {
		w.Header().Set("API-Version", APIVersion)
	}
	writeError(w, err)
}

// runName is the name of the Run of the container ref names, or ref
// itself when there is none: the caller is then authorised on that name,
// so that one who may not learns nothing (403 either way), and one who
// may gets Docker's 404.
func (s *Server) runName(ref string) string {
	if c, err := s.lookup(ref); err == nil {
		return c.name
	}
	return strings.TrimPrefix(ref, "/")
}

// execRunName is the name of the Run an exec is into, or a name no Run
// has when there is no such exec (authorised as the namespace's Runs:
// "").
func (s *Server) execRunName(id string) string {
	e, err := s.execs.get(id)
	if err != nil {
		return ""
	}
	return s.runName(e.container)
}
