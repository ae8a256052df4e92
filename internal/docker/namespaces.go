package docker

import (
	"context"
	"net/http"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/util/validation"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/gateway"
	"stoke.dev/stoke/internal/store"
)

// namespacePrefix selects the namespace of a request's containers: a
// client sets it in its host, DOCKER_HOST=tcp://HOST:PORT/namespaces/NS,
// which the Docker CLI and the SDK put before every path.
const namespacePrefix = "/namespaces/"

// Namespaces serves the Docker API over many namespaces, one Server each
// (its created containers, execs and Run watch), made at a namespace's
// first request by a caller who may read its Runs. A request names its
// namespace with the path prefix /namespaces/NS; without it, it is
// Config.Namespace's. The Kubernetes gateway serves it.
type Namespaces struct {
	cfg Config
	max int

	mu      sync.Mutex
	servers map[string]*Server
	ctx     context.Context // Run's, once it runs
	wg      sync.WaitGroup
}

// NewNamespaces returns the handler; each namespace's Server has cfg with
// its Namespace. At most bounds.DockerNamespaces namespaces are served.
func NewNamespaces(cfg Config) *Namespaces {
	n := &Namespaces{cfg: cfg, max: bounds.DockerNamespaces, servers: map[string]*Server{}}
	_, _ = n.server(n.defaultNamespace()) // the first of max: it cannot fail
	return n
}

func (n *Namespaces) defaultNamespace() string {
	if n.cfg.Namespace == "" {
		return store.DefaultNamespace
	}
	return n.cfg.Namespace
}

// ServeHTTP finds the request's namespace and its Server.
func (n *Namespaces) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ns, path := n.defaultNamespace(), r.URL.Path
	if rest, ok := strings.CutPrefix(path, namespacePrefix); ok {
		ns, path, _ = strings.Cut(rest, "/")
		path = "/" + path
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			writeError(w, errdefs.InvalidArgument("namespace", "%s: %s", bounds.Quote(ns), strings.Join(errs, "; ")))
			return
		}
	}
	s, ok := n.get(ns)
	if !ok {
		// The namespace's state and watch are made for a caller who may
		// read its Runs; others learn nothing of it.
		if err := n.authorizeNamespace(r, ns); err != nil {
			refuse(w, r, err)
			return
		}
		var err error
		if s, err = n.server(ns); err != nil {
			writeError(w, err)
			return
		}
	}
	r = r.Clone(r.Context())
	r.URL.Path, r.URL.RawPath = path, ""
	s.ServeHTTP(w, r)
}

func (n *Namespaces) authorizeNamespace(r *http.Request, ns string) error {
	if n.cfg.Auth == nil {
		return nil
	}
	return n.cfg.Auth.Authorize(r, gateway.Access{Verb: "get", Resource: "runs", Namespace: ns})
}

func (n *Namespaces) get(ns string) (*Server, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	s, ok := n.servers[ns]
	return s, ok
}

// server is the namespace's Server, made (and, once Run runs, started)
// if there is none.
func (n *Namespaces) server(ns string) (*Server, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if s, ok := n.servers[ns]; ok {
		return s, nil
	}
	if len(n.servers) >= n.max {
		return nil, errdefs.Errorf(errdefs.ErrResourceExhausted, "the Docker API serves %d namespaces, the most it serves at once", n.max)
	}
	cfg := n.cfg
	cfg.Namespace = ns
	s := New(cfg)
	n.servers[ns] = s
	if n.ctx != nil {
		n.start(s)
	}
	return s, nil
}

// start runs s until Run's context ends (n.mu held).
func (n *Namespaces) start(s *Server) {
	ctx := n.ctx
	n.wg.Go(func() { _ = s.Run(ctx) })
}

// Run runs every namespace's Server until ctx ends, and waits for them.
func (n *Namespaces) Run(ctx context.Context) error {
	n.mu.Lock()
	n.ctx = ctx
	for _, s := range n.servers {
		n.start(s)
	}
	n.mu.Unlock()
	<-ctx.Done()
	n.wg.Wait()
	return nil
}
