// Package standalone wires Stoke's one-machine mode: the SQLite Run store,
// the shared informers, the pool supervisor with its runtime pods, the
// scheduler, the reaper, and one runtimed per ready pod, all in one value
// with Run(ctx) and a small Go API (Runs, Runtimes, and each function's
// proxy hop). The gateway and CLI only add a front door to it; only cmd/ and
// end-to-end tests import this package.
package standalone

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/artifact"
	"stoke.dev/stoke/internal/cgroup"
	"stoke.dev/stoke/internal/controlplane"
	"stoke.dev/stoke/internal/dispatch"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/gateway"
	"stoke.dev/stoke/internal/gitsource"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/lambda"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/metricsrpc"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/pool"
	"stoke.dev/stoke/internal/reaper"
	"stoke.dev/stoke/internal/runlog"
	"stoke.dev/stoke/internal/runtime"
	"stoke.dev/stoke/internal/runtime/server"
	"stoke.dev/stoke/internal/runtimed"
	"stoke.dev/stoke/internal/runuser"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/sqlite"
	"stoke.dev/stoke/internal/validation"
	"stoke.dev/stoke/internal/workflow"
)

// Config configures a standalone control plane.
type Config struct {
	// DataDir holds the store (db/), the pods (pods/) and the Runs'
	// working directories (runs/).
	DataDir string
	Logger  *slog.Logger
	// DefaultRuntimes are created on first start, when the store holds no
	// Runtime; nil means DefaultRuntimes().
	DefaultRuntimes []*v1alpha1.Runtime
	// PodCommand overrides how a pod's Runtime Server is started (tests
	// pass a built stoke binary); nil runs this executable.
	PodCommand func(pod podsource.Pod, args []string) *exec.Cmd
	// HealthInterval is the pods' health-check period (default 1 s).
	HealthInterval time.Duration
	// StatusPoll is runtimed's FunctionStatus cadence (default 1 s).
	StatusPoll time.Duration
	// EndpointBase is the gateway's base URL ("http://127.0.0.1:7070"); a
	// Ready function's status.endpoint is its invoke URL under it.
	EndpointBase string
	// LambdaCollectInterval is how often functions of lambda Runtimes
	// whose Run is gone are deleted (default lambda.DefaultCollectInterval).
	LambdaCollectInterval time.Duration
	// Metrics, when set, get the scheduler's metrics.
	Metrics *controlplane.Metrics
	// FinishedRunTTL is how long a finished Run that sets no
	// ttlSecondsAfterFinished is kept; zero keeps it until deleted.
	FinishedRunTTL time.Duration
	// ArtifactRetention is how long a workflow artifact is kept at most
	// (0: bounds.ArtifactRetentionDefault); its WorkflowRun's delete takes
	// it sooner.
	ArtifactRetention time.Duration
	// ArtifactS3, when its Bucket is set, is the workflow artifact store
	// (the one Kubernetes mode's controller takes, for instance for jobs
	// on lambda Runtimes, whose sandboxes are not this machine); else the
	// store is <data>/artifacts.
	ArtifactS3 artifact.S3Config
	// Cgroup, when set, is the cgroup v2 the pods run under (pool.Config.Cgroup).
	Cgroup *cgroup.Group
	// DebugSockets gives each pod a debug socket (pool.Config.DebugSockets).
	DebugSockets bool
	// RunAs is the unprivileged user the pods' Runs run as
	// (pool.Config.RunAs); nil: as this process.
	RunAs *runuser.User
	// GitCredentials, when set, is the file (git's credential-store
	// format) whose credentials fetches of spec.source.git send.
	GitCredentials string
}

// DefaultRuntimes are the pools `stoke up` starts with: bash and python,
// two pods of eight Run slots each.
func DefaultRuntimes() []*v1alpha1.Runtime {
	mk := func(name string) *v1alpha1.Runtime {
		return &v1alpha1.Runtime{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindRuntime},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: store.DefaultNamespace},
			Spec:       v1alpha1.RuntimeSpec{Server: name, Replicas: 2, Runs: 8},
		}
	}
	return []*v1alpha1.Runtime{mk("bash"), mk("python")}
}

// Standalone is the whole one-machine control plane.
type Standalone struct {
	cfg      Config
	log      *slog.Logger
	store    *sqlite.Store
	runInf   *informer.Informer[*v1alpha1.Run]
	rtInf    *informer.Informer[*v1alpha1.Runtime]
	pods     *pool.Supervisor
	core     *controlplane.Core
	logs     *runlog.Store
	runsRoot string
	workDirs *runtime.DirPool // the Runs' working directories, for every runtimed
	git      *gitsource.Cache // spec.source.git's cache, for every runtimed
	// fns dispatches the Functions' invocations to their replica Runs.
	fns *gateway.Functions
	// artifacts are the WorkflowRuns' artifacts (upload-artifact).
	artifacts *artifact.Store

	mu      sync.Mutex
	daemons map[string]*podDaemon // by pod UID
	ctx     context.Context
}

// podDaemon is one pod's runtimed. Its proxy hop is only called in
// process (FunctionProxy, Route): it listens on no socket, so nothing
// reaches a function without passing the gateway's authentication.
type podDaemon struct {
	pod  podsource.Pod
	d    *runtimed.Started
	conn *grpc.ClientConn
}

// New opens the store in cfg.DataDir (one process at a time) and builds
// every component; Run starts them.
func New(ctx context.Context, cfg Config) (*Standalone, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("standalone: a data directory is required")
	}
	cfg.Logger = logging.OrDiscard(cfg.Logger)
	if cfg.DefaultRuntimes == nil {
		cfg.DefaultRuntimes = DefaultRuntimes()
	}
	st, err := sqlite.Open(ctx, filepath.Join(cfg.DataDir, "db"))
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	s := &Standalone{cfg: cfg, log: cfg.Logger, store: st, daemons: map[string]*podDaemon{},
		runsRoot: filepath.Join(cfg.DataDir, "runs")}
	inf := controlplane.NewInformers(st, cfg.Logger)
	s.runInf, s.rtInf = inf.Runs, inf.Runtimes
	s.logs, err = runlog.New(filepath.Join(cfg.DataDir, "logs"), cfg.Logger)
	if err != nil {
		st.Close()
		return nil, err
	}
	// Emptied working directories are kept for the next Runs (in runsRoot,
	// which every pod's workspace root is).
	s.workDirs, err = runtime.NewDirPool(filepath.Join(s.runsRoot, ".pool"))
	if err != nil {
		st.Close()
		return nil, err
	}
	// The pods share one git cache, in the data directory (0700: no Run
	// reaches it); runtimed, in this process, fetches into it.
	var creds gitsource.Credentials
	if cfg.GitCredentials != "" {
		fc, err := gitsource.ReadCredentialsFile(cfg.GitCredentials)
		if err != nil {
			st.Close()
			return nil, err
		}
		creds = fc
	}
	if s.git, err = gitsource.New(gitsource.Config{Dir: filepath.Join(cfg.DataDir, "git"), Credentials: creds, Logger: cfg.Logger}); err != nil {
		st.Close()
		return nil, err
	}
	s.pods, err = pool.NewSupervisor(pool.Config{Store: st, DataDir: cfg.DataDir, Command: cfg.PodCommand,
		Logger: cfg.Logger, HealthInterval: cfg.HealthInterval, RunLogDir: s.logs.Dir(), Cgroup: cfg.Cgroup,
		DebugSockets: cfg.DebugSockets, RunAs: cfg.RunAs})
	if err != nil {
		st.Close()
		return nil, err
	}
	// Workflow artifacts live under the data directory; the workflow
	// controller copies them through exec into the Runs (s.ExecRoute).
	if s.artifacts, err = openArtifacts(ctx, cfg); err != nil {
		st.Close()
		return nil, err
	}
	s.core, err = controlplane.New(controlplane.Config{Store: st, Informers: inf, Pods: s.pods, Logger: cfg.Logger,
		Metrics: cfg.Metrics, FinishedRunTTL: cfg.FinishedRunTTL, DeleteWorkflowSteps: true,
		WorkflowArtifacts: workflow.MoverArtifacts(s.ArtifactMover()),
		// The autoscaler reads the dispatcher's loads (s.fns is set below,
		// before anything runs).
		FunctionLoad: func(namespace, name string) (int, int) {
			l := s.fns.Dispatcher().Load(dispatch.Key{Namespace: namespace, Name: name})
			return l.InFlight, l.Queued
		},
		// A draining replica may go once the dispatcher has nothing on it.
		FunctionDrained: func(namespace, function, runUID string) bool {
			return !s.fns.Dispatcher().InFlightOn(dispatch.Key{Namespace: namespace, Name: function}, runUID)
		},
		OnDeleted: func(run *v1alpha1.Run) {
			_ = os.RemoveAll(filepath.Join(s.runsRoot, string(run.UID)))
			s.logs.Remove(string(run.UID))
		}})
	if err != nil {
		st.Close()
		return nil, err
	}
	// No pod of the previous process is alive (the supervisor kills what is
	// left of them before it starts any): settle the Runs they held before
	// the API serves, so that none is shown Ready on a pod that is gone.
	sum, err := s.core.Reaper.RecoverRestart(ctx)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("recovering runs after a restart: %w", err)
	}
	if sum != (reaper.RestartSummary{}) {
		cfg.Logger.Info("runs of the previous process's pods", "requeued", sum.Requeued, "retried_or_failed", sum.Recovered, "finalizers_released", sum.Released)
	}
	// Route every Run event to the runtimed of the pod it is assigned to.
	s.runInf.AddEventHandler(runtimed.Dispatch(func(podUID string) *runtimed.Daemon {
		if pd := s.daemon(podUID); pd != nil {
			return pd.d.Daemon
		}
		return nil
	}))
	s.fns = gateway.NewFunctions(gateway.FunctionsConfig{Hop: s.FunctionProxy,
		Synced:     func() bool { return s.runInf.HasSynced() && inf.Functions.HasSynced() },
		Function:   gateway.FunctionSettings(inf.Functions),
		Fetch:      gateway.FunctionFetch(inf.Functions),
		Dispatcher: dispatch.New(dispatch.Config{OnQueue: func(k dispatch.Key) { s.core.Autoscaler.Poke(k.Namespace, k.Name) }})})
	s.runInf.AddEventHandler(s.fns.Handler())
	inf.Functions.AddEventHandler(s.fns.FunctionHandler())
	// Before New returns, so that the API can take Runs for the default
	// Runtimes as soon as it serves.
	if err := s.ensureRuntimes(ctx); err != nil {
		st.Close()
		return nil, err
	}
	return s, nil
}

// PodMetrics gathers the metrics of every pod's Runtime Server over the
// gRPC connection its runtimed already has (metrics.v1 on the pod's Unix
// socket), labelled with the pod, its Runtime and namespace: stoke up
// serves them on its own authenticated /metrics, so no pod opens a port.
func (s *Standalone) PodMetrics() prometheus.Gatherer {
	return metricsrpc.NewGatherer(func() []metricsrpc.Target {
		s.mu.Lock()
		defer s.mu.Unlock()
		targets := make([]metricsrpc.Target, 0, len(s.daemons))
		for _, pd := range s.daemons {
			targets = append(targets, metricsrpc.Target{Conn: pd.conn, Labels: map[string]string{
				"namespace": pd.pod.Namespace, "runtime": pd.pod.Runtime, "pod": pd.pod.Name}})
		}
		return targets
	}, podScrapeTimeout, s.log)
}

// podScrapeTimeout bounds the scrape of one pod's metrics.
const podScrapeTimeout = 2 * time.Second

func (s *Standalone) daemon(podUID string) *podDaemon {
	if podUID == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.daemons[podUID]
}

// Run runs the control plane until ctx ends, then stops every pod and
// closes the store.
func (s *Standalone) Run(ctx context.Context) error {
	defer s.store.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.mu.Lock()
	s.ctx = ctx
	s.mu.Unlock()

	collector := &lambda.Collector{Interval: s.cfg.LambdaCollectInterval, Prefixes: s.lambdaPrefixes, Exists: s.runNeedsFunction, Logger: s.log}
	err := controlplane.Run(ctx, s.log, append(s.core.Components(),
		controlplane.Component{Name: "pool", Run: s.pods.Run},
		controlplane.Component{Name: "run logs", Run: s.logs.Run},
		controlplane.Component{Name: "pod events", Run: s.followPods},
		controlplane.Component{Name: "lambda collector", Run: collector.Run},
		controlplane.Component{Name: "artifact sweep", Run: s.sweepArtifacts})...)
	cancel()
	s.mu.Lock()
	daemons := s.daemons
	s.daemons = map[string]*podDaemon{}
	s.mu.Unlock()
	for _, pd := range daemons {
		pd.stop()
	}
	if cerr := s.workDirs.Close(); cerr != nil {
		s.log.Warn("removing the pool of working directories", "error", cerr)
	}
	return err
}

// lambdaPrefixes are the function name prefixes of the lambda Runtimes.
func (s *Standalone) lambdaPrefixes() []string {
	var prefixes []string
	for _, rt := range s.rtInf.List(func(rt *v1alpha1.Runtime) bool { return rt.Spec.Lambda != nil }) {
		p := cmp.Or(rt.Spec.Lambda.NamePrefix, lambda.DefaultNamePrefix)
		if !slices.Contains(prefixes, p) {
			prefixes = append(prefixes, p)
		}
	}
	return prefixes
}

// runNeedsFunction reports whether the Run with this UID exists and has
// not finished. It answers from the Run cache, which holds every Run
// before it can be scheduled, hence before its function is created.
func (s *Standalone) runNeedsFunction(ctx context.Context, uid string) (bool, error) {
	if err := s.runInf.WaitForSync(ctx); err != nil {
		return false, err
	}
	return len(s.runInf.List(func(r *v1alpha1.Run) bool {
		return string(r.UID) == uid && !r.Status.Phase.Terminal()
	})) > 0, nil
}

// ensureRuntimes creates the default Runtimes on first start.
func (s *Standalone) ensureRuntimes(ctx context.Context) error {
	existing, _, err := s.store.Runtimes().List(ctx, store.ListOptions{})
	if err != nil {
		return fmt.Errorf("list runtimes: %w", err)
	}
	if len(existing) > 0 {
		return nil
	}
	for _, rt := range s.cfg.DefaultRuntimes {
		if _, err := s.ApplyRuntime(ctx, rt.DeepCopy()); err != nil {
			return fmt.Errorf("default runtime %s: %w", rt.Name, err)
		}
	}
	return nil
}

// followPods starts a runtimed for each ready pod and stops it when the
// pod is gone (the pod is fenced first; the reaper handles its Runs).
func (s *Standalone) followPods(ctx context.Context) error {
	events, snapshot, cancel := s.pods.Subscribe()
	defer cancel()
	for _, p := range snapshot {
		s.podReady(ctx, p)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				return nil
			}
			switch ev.Type {
			case podsource.PodReady:
				s.podReady(ctx, ev.Pod)
			case podsource.PodGone:
				s.mu.Lock()
				pd := s.daemons[ev.Pod.UID]
				delete(s.daemons, ev.Pod.UID)
				s.mu.Unlock()
				if pd != nil {
					pd.stop()
				}
			}
		}
	}
}

func (s *Standalone) podReady(ctx context.Context, p podsource.Pod) {
	s.mu.Lock()
	if _, ok := s.daemons[p.UID]; ok {
		s.mu.Unlock()
		return // a repeated PodReady (e.g. new slot count)
	}
	s.mu.Unlock()
	pd, err := s.startDaemon(ctx, p)
	if err != nil {
		s.log.Error("starting runtimed", "pod", p.Name, "error", err)
		return
	}
	s.mu.Lock()
	s.daemons[p.UID] = pd
	s.mu.Unlock()
	pd.d.Replay(s.runInf)
}

func (s *Standalone) startDaemon(parent context.Context, p podsource.Pod) (*podDaemon, error) {
	conn, err := grpc.NewClient(p.Addr, server.DialOptions()...)
	if err != nil {
		return nil, fmt.Errorf("pod %s: dial: %w", p.Name, err)
	}
	cfg := runtimed.Config{Pod: p, Runs: s.store.Runs(), Conn: conn, Logger: s.log, // runtimed names its pod itself
		StatusPoll: s.cfg.StatusPoll, Endpoint: s.endpoint, WorkDirs: s.workDirs, Git: s.git}
	if rt, ok := s.rtInf.Get(p.Namespace, p.Runtime); ok {
		cfg.DefaultTaskTimeout, cfg.DefaultFunctionTimeout = runtimed.RuntimeDefaults(rt)
	}
	return &podDaemon{pod: p, d: runtimed.Start(parent, cfg), conn: conn}, nil
}

func (pd *podDaemon) stop() {
	pd.d.Stop()
	_ = pd.conn.Close()
}

// Store exposes the Run store (read-mostly users: the gateway's informer).
func (s *Standalone) Store() store.Store { return s.store }

// CreateRun defaults and validates a Run and stores it. A Run naming a
// Runtime that does not exist is refused: nothing is stored.
func (s *Standalone) CreateRun(ctx context.Context, run *v1alpha1.Run) (*v1alpha1.Run, error) {
	validation.SetRunDefaults(run)
	if err := validation.ValidateRun(run); err != nil {
		return nil, err
	}
	// The informer's cache answers for a Runtime it holds; only a miss (a
	// Runtime created a moment ago, or none) asks the store. Either way a
	// Runtime deleted just after this check is the scheduler's to report.
	if _, ok := s.rtInf.Get(run.Namespace, run.Spec.Runtime); ok {
		return s.store.Runs().Create(ctx, run)
	}
	if _, err := s.store.Runtimes().Get(ctx, run.Namespace, run.Spec.Runtime); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, errdefs.InvalidArgument("spec.runtime", "no Runtime %q in namespace %q", run.Spec.Runtime, run.Namespace)
		}
		return nil, err
	}
	return s.store.Runs().Create(ctx, run)
}

// cacheCatchUp bounds how long a read of the store waits for the Runs
// cache to reach what it read (see awaitCache).
const cacheCatchUp = 5 * time.Second

// awaitCache waits, up to cacheCatchUp, until the Runs informer reflects
// version rv. The invoke path routes from that cache, so a client shown a
// Run Ready (by GetRun or WatchRuns) and invoking it at once must not
// find the cache still a version behind.
func (s *Standalone) awaitCache(ctx context.Context, rv string) {
	ctx, cancel := context.WithTimeout(ctx, cacheCatchUp)
	defer cancel()
	_ = s.runInf.WaitForResourceVersion(ctx, rv)
}

// GetRun reads one Run, once the cache has caught up with it.
func (s *Standalone) GetRun(ctx context.Context, namespace, name string) (*v1alpha1.Run, error) {
	run, err := s.store.Runs().Get(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	s.awaitCache(ctx, run.ResourceVersion)
	return run, nil
}

// CachedRun reads a Run from the informer's memory, which may lag the
// store by a moment.
func (s *Standalone) CachedRun(namespace, name string) (*v1alpha1.Run, bool) {
	return s.runInf.Get(namespace, name)
}

// CachedRuntime reads a Runtime from the informer's memory, which may
// lag the store by a moment.
func (s *Standalone) CachedRuntime(namespace, name string) (*v1alpha1.Runtime, bool) {
	return s.rtInf.Get(namespace, name)
}

// CachedRuntimes lists the Runtimes of a namespace in the informer's
// memory.
func (s *Standalone) CachedRuntimes(namespace string) []*v1alpha1.Runtime {
	return s.rtInf.List(func(rt *v1alpha1.Runtime) bool { return rt.Namespace == namespace })
}

// CachedRuns lists the Runs of a namespace in the informer's memory.
func (s *Standalone) CachedRuns(namespace string) []*v1alpha1.Run {
	return s.runInf.List(func(r *v1alpha1.Run) bool { return r.Namespace == namespace })
}

// WaitRunsSynced waits until the Run cache (CachedRuns, CachedRun) holds
// what the store held when it started, or ctx ends.
func (s *Standalone) WaitRunsSynced(ctx context.Context) error { return s.runInf.WaitForSync(ctx) }

// ListRuns lists Runs.
func (s *Standalone) ListRuns(ctx context.Context, opts store.ListOptions) ([]*v1alpha1.Run, string, error) {
	return s.store.Runs().List(ctx, opts)
}

// WatchRuns watches Runs from a resource version. Each event is delivered
// once the cache has caught up with it, as GetRun does.
func (s *Standalone) WatchRuns(ctx context.Context, opts store.WatchOptions) (store.Watcher[*v1alpha1.Run], error) {
	inner, err := s.store.Runs().Watch(ctx, opts)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	w := &cachedWatch{inner: inner, cancel: cancel, events: make(chan store.Event[*v1alpha1.Run]), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer close(w.events)
		for ev := range inner.Events() {
			if ev.Object != nil {
				s.awaitCache(ctx, ev.Object.ResourceVersion)
			}
			select {
			case w.events <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return w, nil
}

// cachedWatch is a store watch whose events wait for the Runs cache. Its
// channel is unbuffered, so a slow reader still fills the store watch's
// bounded buffer and gets its expiry error.
type cachedWatch struct {
	inner  store.Watcher[*v1alpha1.Run]
	cancel context.CancelFunc
	events chan store.Event[*v1alpha1.Run]
	done   chan struct{}
}

func (w *cachedWatch) Events() <-chan store.Event[*v1alpha1.Run] { return w.events }

// Stop ends the watch and waits until its channel is closed; it is safe
// to call more than once.
func (w *cachedWatch) Stop() {
	w.cancel()
	w.inner.Stop()
	<-w.done
}

// CancelRun sets spec.cancelRequested; runtimed (or, for a Pending Run,
// the scheduler) ends the Run as Cancelled.
func (s *Standalone) CancelRun(ctx context.Context, namespace, name string) (*v1alpha1.Run, error) {
	return store.RequestCancel(ctx, s.store.Runs(), namespace, name)
}

// ReleaseRun clears a held Run's spec.held (`docker start` of a created
// container); the scheduler then places it.
func (s *Standalone) ReleaseRun(ctx context.Context, namespace, name string) (*v1alpha1.Run, error) {
	return store.ReleaseHold(ctx, s.store.Runs(), namespace, name)
}

// DeleteRun deletes a Run and returns it as it was; a function Run first
// drains and unregisters.
func (s *Standalone) DeleteRun(ctx context.Context, namespace, name string) (*v1alpha1.Run, error) {
	run, err := s.store.Runs().Get(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	err = s.store.Runs().Delete(ctx, namespace, name, store.DeleteOptions{Preconditions: store.Preconditions{UID: string(run.UID)}})
	return run, err
}

// GetRuntime reads one Runtime.
func (s *Standalone) GetRuntime(ctx context.Context, namespace, name string) (*v1alpha1.Runtime, error) {
	return s.store.Runtimes().Get(ctx, namespace, name)
}

// ListRuntimes lists Runtimes.
func (s *Standalone) ListRuntimes(ctx context.Context, opts store.ListOptions) ([]*v1alpha1.Runtime, string, error) {
	return s.store.Runtimes().List(ctx, opts)
}

// WatchRuntimes watches Runtimes from a resource version.
func (s *Standalone) WatchRuntimes(ctx context.Context, opts store.WatchOptions) (store.Watcher[*v1alpha1.Runtime], error) {
	return s.store.Runtimes().Watch(ctx, opts)
}

// DeleteRuntime deletes a Runtime and returns it as it was; its pods stop,
// and its waiting Runs fail.
func (s *Standalone) DeleteRuntime(ctx context.Context, namespace, name string) (*v1alpha1.Runtime, error) {
	rt, err := s.store.Runtimes().Get(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	err = s.store.Runtimes().Delete(ctx, namespace, name, store.DeleteOptions{Preconditions: store.Preconditions{UID: string(rt.UID)}})
	return rt, err
}

// Logs is the per-Run output logs.
func (s *Standalone) Logs() *runlog.Store { return s.logs }

// RunPhases counts the Runs in memory by phase (for metrics).
func (s *Standalone) RunPhases() map[v1alpha1.Phase]int {
	counts := map[v1alpha1.Phase]int{}
	s.runInf.List(func(r *v1alpha1.Run) bool {
		counts[r.Status.Phase]++
		return false
	})
	return counts
}

// endpoint is a Ready function's invoke URL under the gateway.
func (s *Standalone) endpoint(run *v1alpha1.Run) string {
	return fmt.Sprintf("%s/v1/namespaces/%s/runs/%s/%s/invoke", strings.TrimSuffix(s.cfg.EndpointBase, "/"), run.Namespace, run.Name, run.UID)
}

// ApplyRuntime creates or updates a Runtime.
func (s *Standalone) ApplyRuntime(ctx context.Context, rt *v1alpha1.Runtime) (*v1alpha1.Runtime, error) {
	validation.SetRuntimeDefaults(rt)
	if err := validation.ValidateRuntime(rt); err != nil {
		return nil, err
	}
	if err := validation.ValidateStandaloneRuntime(rt); err != nil {
		return nil, err
	}
	return store.CreateOrUpdate(ctx, s.store.Runtimes(), rt, func(cur *v1alpha1.Runtime) (*v1alpha1.Runtime, error) {
		next := cur.DeepCopy()
		next.Spec = rt.Spec
		next.Labels = rt.Labels
		return next, validation.ValidateRuntimeUpdate(cur, next)
	})
}

// FunctionProxy returns the in-process proxy hop serving a Ready function
// Run (gateway.Invocable says which are not), or Unavailable with a
// Retry-After when its pod is gone.
func (s *Standalone) FunctionProxy(run *v1alpha1.Run) (pb.FunctionRuntimeServer, error) {
	if err := gateway.Invocable(run); err != nil {
		return nil, err
	}
	pd := s.daemon(run.Status.AssignedPodUID)
	if pd == nil {
		return nil, gateway.PodGone(run)
	}
	return &routedHop{FunctionRuntimeServer: pd.d.Proxy(), s: s, run: run}, nil
}

// Route finds a Ready function's proxy hop from the informer's memory —
// the store only on a miss (routedRun) — for the gateway's invoke path. A Run whose name and UID
// do not match is NotFound; before the cache has synced, every Run is
// Unavailable with a Retry-After.
func (s *Standalone) Route(namespace, name, uid string) (pb.FunctionRuntimeServer, error) {
	if !s.runInf.HasSynced() {
		// Just started: the cache does not know any Run yet.
		return nil, errdefs.WithRetryAfter(errdefs.Errorf(errdefs.ErrUnavailable, "stoke is starting; run %s/%s is not routable yet", namespace, name), gateway.NotReadyRetry)
	}
	run, err := s.routedRun(namespace, name)
	if err != nil {
		return nil, err
	}
	if string(run.UID) != uid {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "run %s/%s with uid %s not found", namespace, name, uid)
	}
	return s.FunctionProxy(run)
}

// routedRun is the Run namespace/name from the informer's memory; one
// the store has and the informer not yet (created a moment ago) is
// waited for, bounded by informer.CatchUp (informer.Informer.Fetch; the
// gateway's Router and ExecRouter have no context of their caller's).
func (s *Standalone) routedRun(namespace, name string) (*v1alpha1.Run, error) {
	run, err := s.runInf.Fetch(context.Background(), namespace, name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "run %s/%s not found", namespace, name)
	}
	if err != nil {
		return nil, fmt.Errorf("run %s/%s: %w", namespace, name, err)
	}
	return run, nil
}

// Functions is the gateway's route to the Functions' replicas; its
// dispatcher holds their in-flight and queued counts.
func (s *Standalone) Functions() *gateway.Functions { return s.fns }

// Pods returns the ready runtime pods.
func (s *Standalone) Pods() []podsource.Pod { return s.pods.Pods() }
