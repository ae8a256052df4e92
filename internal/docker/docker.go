// Package docker serves a subset of the Docker Engine API on a Unix socket
// (`stoke up --docker-socket`), so that the Docker CLI and SDKs run
// workloads on Stoke's pools unchanged: an image names a Runtime (images.go),
// a container is a task Run (containers.go), exec and `docker cp` go
// through the one Exec service, as `stoke exec` does (execs.go,
// archive.go). The wire types are github.com/moby/moby/api's; the stream
// framing is written once (framing.go).
package docker

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"sync"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/gateway"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/store"
)

// Backend is the control plane behind the Docker API: the Run objects, the
// Runs in memory, their logs and the exec route. Standalone implements it.
type Backend interface {
	CreateRun(ctx context.Context, run *v1alpha1.Run) (*v1alpha1.Run, error)
	GetRun(ctx context.Context, namespace, name string) (*v1alpha1.Run, error)
	CancelRun(ctx context.Context, namespace, name string) (*v1alpha1.Run, error)
	DeleteRun(ctx context.Context, namespace, name string) (*v1alpha1.Run, error)
	WatchRuns(ctx context.Context, opts store.WatchOptions) (store.Watcher[*v1alpha1.Run], error)
	// CachedRun and CachedRuns read Runs from memory; they may lag the
	// store by a moment.
	CachedRun(namespace, name string) (*v1alpha1.Run, bool)
	CachedRuns(namespace string) []*v1alpha1.Run
	// ListRuns reads Runs from the store: a container another server
	// created a moment ago, not in memory here yet.
	ListRuns(ctx context.Context, opts store.ListOptions) ([]*v1alpha1.Run, string, error)
	// ReleaseRun clears a held Run's spec.held: a created container
	// starts.
	ReleaseRun(ctx context.Context, namespace, name string) (*v1alpha1.Run, error)
	gateway.ExecRouter
}

// Config configures the Docker API server.
type Config struct {
	Backend Backend
	// Logs reads the Runs' logs (gateway.StoreLogReader in standalone).
	Logs gateway.LogReader
	// Images maps image references to Runtimes; nil: DefaultImages.
	Images *Images
	// Namespace holds the containers' Runs (default store.DefaultNamespace).
	Namespace string
	// Version is the server's version string (`docker version`).
	Version string
	// Replicated says other servers follow the same Runs (the Kubernetes
	// gateway's replicas): an AutoRemove container's Run is then deleted
	// by the server that started it only, while it has one attached, and
	// by its TTL otherwise (autoRemoveBackstop); with one server (stoke
	// up) by whichever sees it end.
	Replicated bool
	// Auth, when set, authorises each request before its route runs, on
	// the namespace's Runs as Kubernetes RBAC names them (auth.go; the
	// Kubernetes gateway's SubjectAccessReview). Nil in standalone, where
	// the socket's 0700 directory is the authentication.
	Auth   gateway.Authorizer
	Logger *slog.Logger
}

// Server is the Docker API: its HTTP handler, and Run, which follows the
// Runs (waits, AutoRemove) until its context ends.
type Server struct {
	cfg Config
	log *slog.Logger
	mux *http.ServeMux

	mu sync.Mutex
	// changed is closed (and replaced) at every Run event: waiters look at
	// the Runs in memory again.
	changed chan struct{}
	// attached counts the open attach streams per Run UID: an AutoRemove
	// Run is deleted once it has ended and none reads it any more.
	attached map[string]int
	// started holds the AutoRemove containers this server started, by
	// ID, until their Run is deleted (Config.Replicated).
	started map[string]struct{}
	execs   *execTable
	events  *eventLog
	ctx     context.Context
	bg      sync.WaitGroup
}

// New returns the server; call Run to follow the Runs.
func New(cfg Config) *Server {
	cfg.Logger = logging.OrDiscard(cfg.Logger)
	if cfg.Images == nil {
		cfg.Images = DefaultImages()
	}
	if cfg.Namespace == "" {
		cfg.Namespace = store.DefaultNamespace
	}
	s := &Server{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux(),
		changed: make(chan struct{}), attached: map[string]int{}, started: map[string]struct{}{}, execs: newExecTable(), events: newEventLog(), ctx: context.Background()}
	s.routes()
	return s
}

// ServeHTTP strips and checks the API version of the path, then routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, path, err := negotiate(r.URL.Path)
	if err != nil {
		writeError(w, err)
		return
	}
	r = r.Clone(r.Context())
	r.URL.Path = path
	r.URL.RawPath = ""
	r.RequestURI = path
	if _, pattern := s.mux.Handler(r); pattern == "" {
		if err := s.authorize(r, pattern); err != nil {
			writeError(w, err)
			return
		}
		writeError(w, notFoundPath(r))
		return
	}
	s.mux.ServeHTTP(w, r)
}

// Run follows the Runs until ctx ends: it wakes waiters at every change and
// deletes AutoRemove containers once they ended. Then it waits for detached
// exec sessions.
func (s *Server) Run(ctx context.Context) error {
	s.mu.Lock()
	s.ctx = ctx
	s.mu.Unlock()
	defer s.bg.Wait()
	for {
		err := s.follow(ctx)
		if ctx.Err() != nil {
			return nil
		}
		s.log.Warn("docker api: the Run watch ended; watching again", "error", err)
	}
}

// follow watches the Runs of the namespace from now on.
func (s *Server) follow(ctx context.Context) error {
	w, err := s.cfg.Backend.WatchRuns(ctx, store.WatchOptions{Namespace: s.cfg.Namespace})
	if err != nil {
		return err
	}
	defer w.Stop()
	// Runs that ended while no watch looked.
	s.wake()
	for _, run := range s.cfg.Backend.CachedRuns(s.cfg.Namespace) {
		s.autoRemove(ctx, run)
	}
	for ev := range w.Events() {
		if ev.Type == store.Error {
			return ev.Err
		}
		if ev.Object != nil {
			s.runEvent(ev)
			if ev.Type == store.Deleted {
				s.mu.Lock()
				delete(s.started, containerID(ev.Object))
				s.mu.Unlock()
			}
		}
		s.wake()
		if ev.Object != nil && ev.Type != store.Deleted {
			s.autoRemove(ctx, ev.Object)
		}
	}
	return errors.New("the watch closed")
}

// wake tells every waiter to look again.
func (s *Server) wake() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.changed)
	s.changed = make(chan struct{})
}

// changes is the channel closed at the next Run event.
func (s *Server) changes() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
