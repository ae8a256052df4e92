// Package gateway is Stoke's HTTP front door: the Run and Runtime API, the
// Runs' logs, Prometheus metrics and the invoke dataplane. Every request
// is authenticated with the bearer token first. The invoke path finds the
// owner of a Ready function from memory (never the store), calls it exactly
// once, and maps the answer — through errdefs, the one mapping table — to
// an HTTP status; it never retries after dispatch and never queues.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"golang.org/x/sync/semaphore"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/httpapi"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/logsummary"
	"stoke.dev/stoke/internal/randid"
	"stoke.dev/stoke/internal/runlog"
	"stoke.dev/stoke/internal/store"
)

// Router finds the proxy hop of a Ready function Run from memory. It
// returns NotFound when no Run has that namespace, name and UID, and
// FailedPrecondition or Unavailable when the Run is not Ready or its pod is
// gone.
type Router interface {
	Route(namespace, name, uid string) (pb.FunctionRuntimeServer, error)
}

// Objects is the Run, Runtime and Function API of standalone mode: in Kubernetes
// mode the API server serves these objects and the gateway does not. Its
// errors carry errdefs categories.
type Objects interface {
	CreateRun(ctx context.Context, run *v1alpha1.Run) (*v1alpha1.Run, error)
	GetRun(ctx context.Context, namespace, name string) (*v1alpha1.Run, error)
	ListRuns(ctx context.Context, opts store.ListOptions) ([]*v1alpha1.Run, string, error)
	WatchRuns(ctx context.Context, opts store.WatchOptions) (store.Watcher[*v1alpha1.Run], error)
	CancelRun(ctx context.Context, namespace, name string) (*v1alpha1.Run, error)
	// PatchRun applies a JSON merge patch to a Run's labels, annotations,
	// finalizers and mutable spec fields.
	PatchRun(ctx context.Context, namespace, name string, patch []byte) (*v1alpha1.Run, error)
	DeleteRun(ctx context.Context, namespace, name string) (*v1alpha1.Run, error)

	ApplyRuntime(ctx context.Context, rt *v1alpha1.Runtime) (*v1alpha1.Runtime, error)
	GetRuntime(ctx context.Context, namespace, name string) (*v1alpha1.Runtime, error)
	ListRuntimes(ctx context.Context, opts store.ListOptions) ([]*v1alpha1.Runtime, string, error)
	WatchRuntimes(ctx context.Context, opts store.WatchOptions) (store.Watcher[*v1alpha1.Runtime], error)
	DeleteRuntime(ctx context.Context, namespace, name string) (*v1alpha1.Runtime, error)

	CreateFunction(ctx context.Context, fn *v1alpha1.Function) (*v1alpha1.Function, error)
	// ApplyFunction creates a Function or replaces its spec and labels.
	ApplyFunction(ctx context.Context, fn *v1alpha1.Function) (*v1alpha1.Function, error)
	GetFunction(ctx context.Context, namespace, name string) (*v1alpha1.Function, error)
	ListFunctions(ctx context.Context, opts store.ListOptions) ([]*v1alpha1.Function, string, error)
	WatchFunctions(ctx context.Context, opts store.WatchOptions) (store.Watcher[*v1alpha1.Function], error)
	DeleteFunction(ctx context.Context, namespace, name string) (*v1alpha1.Function, error)

	CreateWorkflowRun(ctx context.Context, w *v1alpha1.WorkflowRun) (*v1alpha1.WorkflowRun, error)
	GetWorkflowRun(ctx context.Context, namespace, name string) (*v1alpha1.WorkflowRun, error)
	ListWorkflowRuns(ctx context.Context, opts store.ListOptions) ([]*v1alpha1.WorkflowRun, string, error)
	WatchWorkflowRuns(ctx context.Context, opts store.WatchOptions) (store.Watcher[*v1alpha1.WorkflowRun], error)
	CancelWorkflowRun(ctx context.Context, namespace, name string) (*v1alpha1.WorkflowRun, error)
	DeleteWorkflowRun(ctx context.Context, namespace, name string) (*v1alpha1.WorkflowRun, error)

	// ApplyWorkflow creates a Workflow or replaces its spec and labels.
	ApplyWorkflow(ctx context.Context, w *v1alpha1.Workflow) (*v1alpha1.Workflow, error)
	GetWorkflow(ctx context.Context, namespace, name string) (*v1alpha1.Workflow, error)
	ListWorkflows(ctx context.Context, opts store.ListOptions) ([]*v1alpha1.Workflow, string, error)
	WatchWorkflows(ctx context.Context, opts store.WatchOptions) (store.Watcher[*v1alpha1.Workflow], error)
	DeleteWorkflow(ctx context.Context, namespace, name string) (*v1alpha1.Workflow, error)
}

// API is standalone's control plane behind the whole HTTP API: the
// objects, the invoke routes, and the Run logs of its own directory.
type API interface {
	Router
	Objects
	// CachedRun reads a Run from memory; it may lag the store.
	CachedRun(namespace, name string) (*v1alpha1.Run, bool)
	Logs() *runlog.Store
}

// Config configures the gateway.
type Config struct {
	// API, when set, serves the objects and, unless Logs is set, the
	// logs: standalone mode.
	API API
	// Router routes invocations; nil means API.
	Router Router
	// Functions, when set, serves the Functions' stable invoke URLs
	// (functions.go).
	Functions FunctionInvoker
	// Exec, when set, serves exec sessions into Runs (exec.go).
	Exec ExecRouter
	// Artifacts, when set, serves WorkflowRuns' artifacts (artifacts.go).
	Artifacts Artifacts
	// Aggregated also serves invoke, exec and logs as the Kubernetes
	// aggregated API gateway.stoke.dev/v1alpha1 (aggregated.go).
	Aggregated bool
	// Logs, when set, serves the Runs' logs; nil means API's.
	Logs LogReader
	// Auth authenticates and authorizes every request but the health
	// checks; nil means TokenAuth(Token).
	Auth Authorizer
	// Token is the bearer token every request must carry when Auth is
	// nil.
	Token string
	// Ready, when set, is /readyz's check: nil error is ready. Without
	// it /readyz answers as /healthz.
	Ready func(ctx context.Context) error
	// Metrics, when set, is served on /metrics and observes invocations.
	Metrics *Metrics
	Logger  *slog.Logger
	// LogFollowPoll bounds how long a log follower goes without looking
	// at its Run's phase (default 250 ms).
	LogFollowPoll time.Duration
	// MaxStreams bounds the open watches and followed logs (default
	// bounds.APIStreams).
	MaxStreams int
	// Timeouts are the HTTP server's (see Server); zero fields take
	// DefaultTimeouts.
	Timeouts Timeouts
	// FailedInvokeLog configures the summary of failed invocations in the
	// log (Logger, Message and KeyAttr are the gateway's): at most one line
	// per function per Interval (default logsummary.DefaultInterval).
	FailedInvokeLog logsummary.Config
}

// Gateway serves the HTTP API.
type Gateway struct {
	cfg Config
	log *slog.Logger
	// mux serves every route and, on "/", what none takes (unrouted);
	// routes has the same routes alone, to tell that from a route
	// asked with another method (404 or 405).
	mux    *http.ServeMux
	routes *http.ServeMux
	// streams holds a token per open watch or followed log.
	streams chan struct{}
	// failed logs failed invocations, summed up per function per
	// interval: a flood of 429s writes a few lines, not one per call.
	failed *logsummary.Summariser
	// bodies holds the bytes of the object bodies being read and decoded
	// (admitBody).
	bodies *semaphore.Weighted
}

// New returns the gateway's HTTP handler.
func New(cfg Config) *Gateway {
	cfg.Logger = logging.OrDiscard(cfg.Logger)
	if cfg.Router == nil && cfg.API != nil {
		cfg.Router = cfg.API
	}
	if cfg.Auth == nil {
		cfg.Auth = TokenAuth(cfg.Token)
	}
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = bounds.APIStreams
	}
	cfg.Timeouts = cfg.Timeouts.withDefaults()
	if cfg.LogFollowPoll <= 0 {
		cfg.LogFollowPoll = 250 * time.Millisecond
	}
	if cfg.Logs == nil && cfg.API != nil {
		cfg.Logs = StoreLogReader(cfg.API, cfg.LogFollowPoll)
	}
	fl := cfg.FailedInvokeLog
	fl.Logger, fl.Level, fl.Message, fl.KeyAttr = cfg.Logger, slog.LevelInfo, "invocations failed", "run"
	g := &Gateway{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux(), routes: http.NewServeMux(), streams: make(chan struct{}, cfg.MaxStreams),
		failed: logsummary.New(fl), bodies: semaphore.NewWeighted(bounds.ObjectBodiesAtOnce)}
	g.mux.HandleFunc("/", g.unrouted)
	cfg.Metrics.countSummarised(g.failed)
	g.route(invokePath, invokeRoute, runAccess("create", "invoke"), g.invoke)
	if cfg.Functions != nil {
		g.route(functionInvokePath, invokeRoute, functionAccess("create", "invoke"), g.invokeFunction)
	}
	if cfg.Logs != nil {
		g.route(logsPath, "logs", runAccess("get", "log"), g.logs)
	}
	if cfg.API != nil {
		g.routeObjects()
	}
	if cfg.Exec != nil {
		g.route(execPath, "exec", runAccess("create", "exec"), g.exec)
	}
	if cfg.Artifacts != nil {
		g.routeArtifacts(false)
	}
	if cfg.Aggregated {
		g.routeAggregated()
	}
	if cfg.Metrics != nil {
		h := cfg.Metrics.handler()
		g.route("GET /metrics", "metrics", func(*http.Request) Access { return Access{Verb: "get", Path: "/metrics"} }, h.ServeHTTP)
	}
	return g
}

// The routes both modes serve.
const (
	invokePath = "POST /v1/namespaces/{ns}/runs/{name}/{uid}/invoke"
	logsPath   = "GET /v1/namespaces/{ns}/runs/{name}/logs"
	// functionInvokePath is a Function's stable URL: it names no Run,
	// and lasts across replica replacement and spec changes.
	functionInvokePath = "POST /v1/namespaces/{ns}/functions/{name}/invoke"
)

// invokeRoute names both invoke routes (a Run's, a Function's) in the
// request metrics.
const invokeRoute = "invoke"

// route serves pattern with h once the caller is authorized for what
// access says of the request, and counts the request under the route's
// name (a bounded label).
func (g *Gateway) route(pattern, name string, access func(*http.Request) Access, h http.HandlerFunc) {
	g.routes.Handle(pattern, http.NotFoundHandler()) // never served: routes is only asked which pattern matches
	g.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		defer func() { g.cfg.Metrics.observeRequest(name, sw.status, time.Since(start)) }()
		if err := g.cfg.Auth.Authorize(r, access(r)); err != nil {
			g.refuse(sw, name == invokeRoute, err)
			return
		}
		h(sw, r)
	})
}

// runAccess is the access a route on one Run needs: verb on its
// subresource ("" for the Run itself), in the Run's namespace.
func runAccess(verb, subresource string) func(*http.Request) Access {
	return func(r *http.Request) Access {
		return Access{Verb: verb, Resource: "runs", Subresource: subresource, Namespace: r.PathValue("ns"), Name: r.PathValue("name")}
	}
}

// functionAccess is the access a route on one Function needs: verb on
// its subresource, in its namespace (Kubernetes RBAC: `create` on
// `functions/invoke`).
func functionAccess(verb, subresource string) func(*http.Request) Access {
	return func(r *http.Request) Access {
		return Access{Verb: verb, Resource: "functions", Subresource: subresource, Namespace: r.PathValue("ns"), Name: r.PathValue("name")}
	}
}

// refuse answers a request its caller may not make: 401 with the
// challenge, 403, or the authorizer's own failure.
func (g *Gateway) refuse(w http.ResponseWriter, invoke bool, err error) {
	if errors.Is(err, errdefs.ErrUnauthenticated) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="stoke"`)
	}
	invID := ""
	if invoke {
		invID = randid.New("inv_") // every invoke answer carries one
	}
	writeError(w, err, invID)
}

// ServeHTTP authenticates every request but the health check before
// routing it.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer g.recoverPanic(w, r)
	switch r.URL.Path {
	case "/healthz":
		writeText(w, http.StatusOK, "ok\n")
		return
	case "/readyz":
		if g.cfg.Ready != nil {
			if err := g.cfg.Ready(r.Context()); err != nil {
				writeText(w, http.StatusServiceUnavailable, "not ready: "+err.Error()+"\n")
				return
			}
		}
		writeText(w, http.StatusOK, "ok\n")
		return
	}
	if !plainPath(r.URL.Path) {
		// The mux would redirect this path to its cleaned form, the
		// catch-all's included: one whose cleaned form no route takes
		// is answered here instead, as any other path no route takes.
		if _, pattern := g.routes.Handler(r); pattern == "" {
			g.unrouted(w, r)
			return
		}
	}
	// The routes are matched once, here: asking the mux first whether
	// one takes the request, then serving it, matched every request
	// twice.
	g.mux.ServeHTTP(w, r)
}

// plainPath says that the mux does not clean path: it begins with a
// slash and holds no empty, "." or ".." segment. It may say no of a path
// the mux leaves as it is (one with a segment beginning with a dot):
// those take the longer way.
func plainPath(path string) bool {
	return strings.HasPrefix(path, "/") && !strings.Contains(path, "//") && !strings.Contains(path, "/.")
}

// unrouted answers a request no route takes: 401 or 403 to a caller not
// authenticated, since who may learn which paths exist is anyone
// authenticated, else 404 or 405 (notRouted).
func (g *Gateway) unrouted(w http.ResponseWriter, r *http.Request) {
	if err := g.cfg.Auth.Authorize(r, Access{}); err != nil {
		g.refuse(w, strings.HasSuffix(r.URL.Path, "/invoke"), err)
		return
	}
	g.notRouted(w, r)
}

// recoverPanic turns a handler's panic — a bug — into a logged stack and
// the JSON 500 every other error gets, rather than net/http's dropped
// connection. A response already under way gets the error as its last
// line. http.ErrAbortHandler, the deliberate abort, goes on.
func (g *Gateway) recoverPanic(w http.ResponseWriter, r *http.Request) {
	p := recover()
	if p == nil {
		return
	}
	if p == http.ErrAbortHandler {
		panic(p)
	}
	g.log.Error("api: handler panicked", "method", r.Method, "path", r.URL.Path, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	writeError(w, errdefs.Errorf(errdefs.ErrInternal, "internal error serving %s %s; the server's log has its stack", r.Method, r.URL.Path), w.Header().Get(httpapi.HeaderInvocationID))
}

// notRouted answers a request no route takes with the mux's own status
// (404, or 405 with Allow) in the JSON error body.
func (g *Gateway) notRouted(w http.ResponseWriter, r *http.Request) {
	h, _ := g.routes.Handler(r)
	probe := &headerProbe{header: http.Header{}}
	h.ServeHTTP(probe, r)
	err := errdefs.Errorf(errdefs.ErrNotFound, "no such path: %s", r.URL.Path)
	if probe.status == http.StatusMethodNotAllowed {
		if allow := probe.header.Get("Allow"); allow != "" {
			w.Header().Set("Allow", allow)
		}
		err = errdefs.Errorf(errdefs.ErrMethodNotAllowed, "%s is not allowed on %s; allowed: %s", r.Method, r.URL.Path, probe.header.Get("Allow"))
	}
	g.reply(w, r, 0, nil, err)
}

// headerProbe takes the answer of the mux's 404 and 405 handlers, whose
// plain-text body is replaced.
type headerProbe struct {
	header http.Header
	status int
}

func (p *headerProbe) Header() http.Header         { return p.header }
func (p *headerProbe) Write(b []byte) (int, error) { return len(b), nil }
func (p *headerProbe) WriteHeader(status int)      { p.status = status }

// openStream takes one of the bounded stream slots; the caller releases
// it with the returned function. When all are taken it answers 429.
func (g *Gateway) openStream(w http.ResponseWriter) (release func(), ok bool) {
	select {
	case g.streams <- struct{}{}:
		return func() { <-g.streams }, true
	default:
		writeError(w, errdefs.Errorf(errdefs.ErrResourceExhausted,
			"%d watch and log streams are open, the most this server keeps; close one and retry", cap(g.streams)), "")
		return nil, false
	}
}

func writeText(w http.ResponseWriter, status int, text string) {
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(text))
}
