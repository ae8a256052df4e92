package kubegateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	x509request "k8s.io/apiserver/pkg/authentication/request/x509"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/docker"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/store"
)

// DockerConfig is the gateway's Docker Engine API port (internal/docker,
// the code standalone's socket runs): containers are task Runs in the
// namespace a client's host names (DOCKER_HOST=tcp://HOST:PORT/namespaces/NS)
// or the default one, every request authorised per Run and namespace as
// the gateway's own routes are.
type DockerConfig struct {
	// Listen is the TLS address; empty: no Docker port.
	Listen string
	// ClientCAFile holds the CA(s) whose client certificates the port
	// authenticates (the common name is the user, the organisations its
	// groups); empty: the cluster's own client CA, from
	// kube-system/extension-apiserver-authentication (client-ca-file), so
	// the certificate of a kubeconfig user is a Docker client's too.
	ClientCAFile string
	// Images maps images to Runtimes; nil: docker.DefaultImages.
	Images *docker.Images
	// Namespace holds the containers of clients whose host names none
	// (default store.DefaultNamespace).
	Namespace string
	Version   string
}

// dockerBackend is docker.Backend over the API server: writes go to it
// with the gateway's identity once the caller's own access is authorised
// (the docker package asks before each route), reads come from the Run
// informer, exec and logs go to the Run's pod over the hop.
type dockerBackend struct {
	*routes
	runs     store.Resource[*v1alpha1.Run]
	runtimes store.Resource[*v1alpha1.Runtime]
	inf      *informer.Informer[*v1alpha1.Run]
	// rts are the Runtimes in memory: an image a Runtime names selects
	// it; a Lambda one refuses what Lambda cannot do (docker.RuntimeReader).
	rts *informer.Informer[*v1alpha1.Runtime]

	mu sync.Mutex
	// seen are the Runs created and not yet in the informer, by UID:
	// closed once it holds them.
	seen map[types.UID]chan struct{}
}

var (
	_ docker.Backend       = (*dockerBackend)(nil)
	_ docker.RuntimeReader = (*dockerBackend)(nil)
)

// cachedBound bounds how long CreateRun waits for the informer to hold
// the Run it created.
const cachedBound = 10 * time.Second

// newDockerBackend is the backend over the Run informer inf; it follows
// inf until ctx ends.
func newDockerBackend(ctx context.Context, rt *routes, runs store.Resource[*v1alpha1.Run], runtimes store.Resource[*v1alpha1.Runtime], inf *informer.Informer[*v1alpha1.Run]) *dockerBackend {
	b := &dockerBackend{routes: rt, runs: runs, runtimes: runtimes, inf: inf, seen: map[types.UID]chan struct{}{},
		rts: informer.New(runtimes, informer.Options{})}
	remove := inf.AddEventHandler(informer.HandlerFuncs[*v1alpha1.Run]{
		AddFunc:    b.held,
		UpdateFunc: func(_, r *v1alpha1.Run) { b.held(r) },
	})
	context.AfterFunc(ctx, remove)
	return b
}

// held is told of each Run the informer holds.
func (b *dockerBackend) held(r *v1alpha1.Run) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ch, ok := b.seen[r.UID]; ok {
		close(ch)
		delete(b.seen, r.UID)
	}
}

// awaitHeld waits until the informer holds the Run created (bounded):
// the routes that follow find it in memory (attach, logs and exec right
// after start), as standalone's CreateRun answers once its cache has it.
func (b *dockerBackend) awaitHeld(ctx context.Context, created *v1alpha1.Run) {
	ch := make(chan struct{})
	b.mu.Lock()
	b.seen[created.UID] = ch
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.seen, created.UID)
		b.mu.Unlock()
	}()
	if r, ok := b.inf.Get(created.Namespace, created.Name); ok && r.UID == created.UID {
		return
	}
	t := time.NewTimer(cachedBound)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
	}
}

// CreateRun creates a container's task Run; its Runtime must be there,
// or the container would wait forever.
func (b *dockerBackend) CreateRun(ctx context.Context, run *v1alpha1.Run) (*v1alpha1.Run, error) {
	if _, err := b.runtimes.Get(ctx, run.Namespace, run.Spec.Runtime); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, errdefs.Errorf(errdefs.ErrNotFound, "runtime %s/%s not found: the image maps to it; create it, or map the image elsewhere (docs/docker.md)", run.Namespace, run.Spec.Runtime)
		}
		return nil, err
	}
	created, err := b.runs.Create(ctx, run)
	if err != nil {
		return nil, err
	}
	b.awaitHeld(ctx, created)
	return created, nil
}

func (b *dockerBackend) GetRun(ctx context.Context, namespace, name string) (*v1alpha1.Run, error) {
	return b.runs.Get(ctx, namespace, name)
}

func (b *dockerBackend) CancelRun(ctx context.Context, namespace, name string) (*v1alpha1.Run, error) {
	return store.RequestCancel(ctx, b.runs, namespace, name)
}

func (b *dockerBackend) ReleaseRun(ctx context.Context, namespace, name string) (*v1alpha1.Run, error) {
	return store.ReleaseHold(ctx, b.runs, namespace, name)
}

func (b *dockerBackend) ListRuns(ctx context.Context, opts store.ListOptions) ([]*v1alpha1.Run, string, error) {
	return b.runs.List(ctx, opts)
}

func (b *dockerBackend) DeleteRun(ctx context.Context, namespace, name string) (*v1alpha1.Run, error) {
	run, err := b.runs.Get(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return run, b.runs.Delete(ctx, namespace, name, store.DeleteOptions{Preconditions: store.Preconditions{UID: string(run.UID)}})
}

func (b *dockerBackend) CachedRun(namespace, name string) (*v1alpha1.Run, bool) {
	return b.inf.Get(namespace, name)
}

func (b *dockerBackend) CachedRuntime(namespace, name string) (*v1alpha1.Runtime, bool) {
	return b.rts.Get(namespace, name)
}

func (b *dockerBackend) CachedRuntimes(namespace string) []*v1alpha1.Runtime {
	return b.rts.List(func(rt *v1alpha1.Runtime) bool { return rt.Namespace == namespace })
}

func (b *dockerBackend) CachedRuns(namespace string) []*v1alpha1.Run {
	return b.inf.List(func(r *v1alpha1.Run) bool { return r.Namespace == namespace })
}

// WatchRuns follows the namespace's Runs from now on through the Run
// informer, so that an event comes once the Runs in memory (CachedRun)
// have it, as standalone's watch does; no watch of its own on the API
// server. A follower that falls bounds.DockerWatchEvents behind has its
// watch ended (the informer never waits for it): it watches again and
// looks at every Run.
func (b *dockerBackend) WatchRuns(ctx context.Context, opts store.WatchOptions) (store.Watcher[*v1alpha1.Run], error) {
	w := &informerWatch{ns: opts.Namespace, ch: make(chan store.Event[*v1alpha1.Run], bounds.DockerWatchEvents)}
	remove := b.inf.AddEventHandler(informer.HandlerFuncs[*v1alpha1.Run]{
		AddFunc:    func(r *v1alpha1.Run) { w.push(store.Added, r) },
		UpdateFunc: func(_, r *v1alpha1.Run) { w.push(store.Modified, r) },
		DeleteFunc: func(r *v1alpha1.Run) { w.push(store.Deleted, r) },
	})
	w.mu.Lock()
	w.remove, w.live = remove, true // what came before is the informer's replay of what it holds
	w.mu.Unlock()
	w.stopCtx = context.AfterFunc(ctx, w.Stop)
	return w, nil
}

// informerWatch is one WatchRuns.
type informerWatch struct {
	ns      string
	ch      chan store.Event[*v1alpha1.Run]
	stopCtx func() bool

	mu     sync.Mutex
	live   bool
	closed bool
	remove func()
}

// push hands an event on, never waiting: the informer calls it for
// every handler in turn.
func (w *informerWatch) push(t store.EventType, r *v1alpha1.Run) {
	if w.ns != "" && r.Namespace != w.ns {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.live || w.closed {
		return
	}
	select {
	case w.ch <- store.Event[*v1alpha1.Run]{Type: t, Object: r}:
	default:
		w.closed = true
		close(w.ch)
	}
}

func (w *informerWatch) Events() <-chan store.Event[*v1alpha1.Run] { return w.ch }

// Stop ends the watch; it is safe to call twice.
func (w *informerWatch) Stop() {
	w.mu.Lock()
	remove := w.remove
	w.remove = nil
	if !w.closed {
		w.closed = true
		close(w.ch)
	}
	w.mu.Unlock()
	if remove != nil {
		remove() // outside mu: it waits for the informer's dispatch, which takes mu
	}
	if w.stopCtx != nil {
		w.stopCtx()
	}
}

// caSource is a CA bundle that follows its source: a file or the
// cluster's ConfigMap.
type caSource interface {
	RunOnce(ctx context.Context) error
	Run(ctx context.Context, workers int)
	VerifyOptions() (x509.VerifyOptions, bool)
}

// dockerCA is the CA of the Docker port's client certificates.
func dockerCA(file string, client kubernetes.Interface) (caSource, error) {
	if file != "" {
		return dynamiccertificates.NewDynamicCAContentFromFile("docker-client-ca", file)
	}
	return dynamiccertificates.NewDynamicCAFromConfigMapController("docker-client-ca",
		authConfigMapNamespace, authConfigMapName, "client-ca-file", client)
}

// dockerPort is the Docker port, served until Run's context ends.
type dockerPort struct {
	b     *dockerBackend
	srv   *http.Server
	lis   net.Listener
	ca    caSource
	api   *docker.Namespaces
	log   *slog.Logger
	reach string
}

// newDockerPort listens on cfg.Listen with serving (the gateway's
// certificate), asking for client certificates, which the cluster's (or
// ClientCAFile's) CA verifies in the Authorizer; a bearer token the API
// server authenticates is taken too (docker's config.json HttpHeaders).
func newDockerPort(cfg DockerConfig, serving *tls.Config, client kubernetes.Interface, auth *Authorizer, b *dockerBackend, log *slog.Logger) (*dockerPort, error) {
	ca, err := dockerCA(cfg.ClientCAFile, client)
	if err != nil {
		return nil, fmt.Errorf("gateway: the Docker port's client CA: %w", err)
	}
	api := docker.NewNamespaces(docker.Config{
		Backend: b, Logs: b.routes, Images: cfg.Images, Namespace: cfg.Namespace, Version: cfg.Version, Logger: log, Replicated: true,
		Auth: auth.WithClientCertificates(x509request.NewDynamic(ca.VerifyOptions, x509request.CommonNameUserConversion)),
	})
	tc := serving.Clone()
	tc.ClientAuth = tls.RequestClientCert
	raw, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("gateway: the Docker port: %w", err)
	}
	srv := &http.Server{Handler: api, ReadHeaderTimeout: 10 * time.Second}
	withTLSState(srv)
	return &dockerPort{b: b, srv: srv, lis: tls.NewListener(raw, tc), ca: ca, api: api, log: log, reach: raw.Addr().String()}, nil
}

// Run serves until ctx ends; then it closes the port, hijacked streams
// too (they end with their Runs' server).
func (p *dockerPort) Run(ctx context.Context) error {
	if err := p.ca.RunOnce(ctx); err != nil {
		p.log.Warn("gateway: cannot read the Docker port's client CA yet; client certificates are refused until it can", "error", err)
	}
	p.srv.BaseContext = func(net.Listener) context.Context { return ctx }
	var wg sync.WaitGroup
	wg.Go(func() { p.ca.Run(ctx, 1) })
	wg.Go(func() { _ = p.b.rts.Run(ctx) })
	wg.Go(func() { _ = p.api.Run(ctx) })
	errc := make(chan error, 1)
	wg.Go(func() { errc <- p.srv.Serve(p.lis) })
	p.log.Info("gateway serving the Docker API", "addr", p.reach)
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	_ = p.srv.Close()
	wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
