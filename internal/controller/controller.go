// Package controller wires `stoke controller`, the control plane of
// Kubernetes mode: the same informers, scheduler, retry engine, stale-run
// reaper and TTL as standalone (internal/controlplane), over the
// Kubernetes store (internal/store/kube) and the runtime Pods
// (internal/kubepods), and the Runtime reconciler (internal/runtimeset)
// that makes each Runtime a Deployment of those Pods.
//
// Replicas elect a leader on the Lease stoke-controller in the
// controller's namespace (controller-runtime's manager, client-go's
// leader election): only the leader runs the scheduler, the reaper, the
// Pod source and the reconciler; the others wait. A leader that cannot
// renew its Lease within RenewDeadline stops at once and Run returns an
// error, so that the process exits non-zero and Kubernetes restarts it as
// a standby; a leader that is stopped releases the Lease so that a
// standby takes over without waiting for it to expire.
//
// No TCP port is open without authentication: liveness and readiness are
// grpc.health.v1 on a Unix socket in a 0700 directory (internal/probe),
// asked by `stoke controller probe` as an exec probe — the service ""
// once the manager runs, "leader" while this replica leads — and
// /metrics is served over HTTPS behind the Kubernetes authentication and
// authorization filter (a TokenReview of the caller's bearer token, a
// SubjectAccessReview of `get` on the non-resource URL /metrics): no or a
// bad token is 401, a caller without the right 403.
package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/artifact"
	"stoke.dev/stoke/internal/client/cluster"
	"stoke.dev/stoke/internal/controlplane"
	"stoke.dev/stoke/internal/kubepods"
	"stoke.dev/stoke/internal/loadreport"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/probe"
	"stoke.dev/stoke/internal/runtimeset"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/kube"
	"stoke.dev/stoke/internal/workflow"
)

// SchedulerWorkers is how many assignments (Scheduled status writes) the
// scheduler has in flight at once. Each is an API round trip, tens to
// hundreds of milliseconds on a busy API server, while the 32 creating
// clients and runtimed's end writes (one per busy slot) have many more in
// flight: with scheduler.DefaultWorkers (4) the assignments bounded a
// burst of short tasks, not the slots (BenchmarkKube/Throughput: 65.5
// against 103.1 Runs/s with 16, docs/benchmarks.md).
const SchedulerWorkers = 16

// LeaseName is the leader-election Lease, in the controller's namespace.
const LeaseName = "stoke-controller"

// Health services on the probe socket.
const (
	// ServiceLeader is SERVING while this replica leads.
	ServiceLeader = "leader"
)

// Defaults.
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
	DefaultMetricsAddr   = ":8443"
	DefaultProbeSocket   = "/var/run/stoke-controller/probe/probe.sock"
	// DefaultDebugSocket is `stoke controller`'s --debug-socket: beside
	// the probe socket, in its 0700 directory (internal/debugsock).
	DefaultDebugSocket = "/var/run/stoke-controller/probe/debug.sock"
	// userAgent names the controller's requests in the API server's logs
	// and metrics.
	userAgent = "stoke-controller"
)

// Config configures a Controller.
type Config struct {
	// REST reaches the API server (a kubeconfig's, or in-cluster).
	REST *rest.Config
	// Namespace is the controller's own: its leader-election Lease, the
	// CA and the gateway's TLS Secret. Required.
	Namespace string
	// Image is the runtime Pods' image (runtimeset's default when empty).
	Image string
	// GatewayURL is the gateway Service's base URL, the base of a Ready
	// function's status.endpoint (runtimeset.Options.GatewayURL).
	GatewayURL string
	// MetricsAddr is the HTTPS /metrics address; "0" disables it; empty
	// means DefaultMetricsAddr.
	MetricsAddr string
	// MetricsCertDir holds /metrics' serving certificate as tls.crt and
	// tls.key (a kubernetes.io/tls Secret mounted there); empty: a
	// self-signed one, made at start.
	MetricsCertDir string
	// ProbeSocket is the probe's Unix socket (DefaultProbeSocket when
	// empty); its directory is made 0700.
	ProbeSocket string
	// LeaseDuration, RenewDeadline and RetryPeriod time the leader
	// election (client-go's meaning; zero means the defaults above).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// KeepLeaseOnStop leaves the Lease held when Run's context ends, as a
	// crash would (tests of the takeover by expiry); by default a stopped
	// leader releases it.
	KeepLeaseOnStop bool
	// NotReadyGrace is kubepods.Config.NotReadyGrace.
	NotReadyGrace time.Duration
	// FinishedRunTTL is how long a finished Run that sets no
	// ttlSecondsAfterFinished is kept; zero keeps it until deleted.
	FinishedRunTTL time.Duration
	// ArtifactS3 is the workflow artifact store (internal/artifact's S3
	// backend); without a Bucket there is none and upload-artifact and
	// download-artifact steps fail. The copies go through the gateway's
	// exec route, as the aggregated API, with the controller's own
	// identity (artifact.ThroughGateway).
	ArtifactS3 artifact.S3Config
	// ArtifactRetention is how long an artifact is kept at most (0:
	// bounds.ArtifactRetentionDefault); a deleted WorkflowRun's go sooner.
	ArtifactRetention time.Duration
	// OnScheduled observes each assignment's scheduling latency.
	OnScheduled func(run *v1alpha1.Run, latency time.Duration)
	// Logger: nil discards (internal/logging).
	Logger *slog.Logger
}

// Controller is one replica of `stoke controller`.
type Controller struct {
	cfg     Config
	log     *slog.Logger
	mgr     manager.Manager
	metrics metricsserver.Server // nil when disabled
	sched   *controlplane.Metrics
	health  *health.Server
	runFeed *runtimeset.RunFeed

	mu      sync.Mutex
	stopped bool           // Run is returning: lead starts nothing more
	leading sync.WaitGroup // the leader's components, until they have stopped
}

// New checks cfg and builds the manager; Run starts it.
func New(cfg Config) (*Controller, error) {
	if cfg.REST == nil {
		return nil, errors.New("controller: a REST config is required")
	}
	if cfg.Namespace == "" {
		return nil, errors.New("controller: the controller's namespace is required")
	}
	cfg.Logger = logging.OrDiscard(cfg.Logger)
	cfg.MetricsAddr = cmp.Or(cfg.MetricsAddr, DefaultMetricsAddr)
	cfg.ProbeSocket = cmp.Or(cfg.ProbeSocket, DefaultProbeSocket)
	cfg.LeaseDuration = cmp.Or(cfg.LeaseDuration, DefaultLeaseDuration)
	cfg.RenewDeadline = cmp.Or(cfg.RenewDeadline, DefaultRenewDeadline)
	cfg.RetryPeriod = cmp.Or(cfg.RetryPeriod, DefaultRetryPeriod)
	rc := rest.CopyConfig(cfg.REST)
	rc.UserAgent = userAgent
	cfg.REST = rc

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c := &Controller{cfg: cfg, log: cfg.Logger, health: probe.NewHealth(ServiceLeader), sched: schedulerMetrics()}
	mgr, err := manager.New(rc, manager.Options{
		Scheme: scheme,
		Logger: logr.FromSlogHandler(cfg.Logger.Handler()),
		// The metrics server is added below, so that its address is known;
		// health is the probe socket, never a TCP port.
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:        "0",
		LeaderElection:                true,
		LeaderElectionID:              LeaseName,
		LeaderElectionNamespace:       cfg.Namespace,
		LeaderElectionResourceLock:    resourcelock.LeasesResourceLock,
		LeaseDuration:                 &cfg.LeaseDuration,
		RenewDeadline:                 &cfg.RenewDeadline,
		RetryPeriod:                   &cfg.RetryPeriod,
		LeaderElectionReleaseOnCancel: !cfg.KeepLeaseOnStop,
		// Controller names are unique per process so that their metrics do
		// not mix; a process runs one replica, but tests run two.
		Controller: ctrlconfig.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return nil, fmt.Errorf("controller: manager: %w", err)
	}
	c.mgr = mgr
	if cfg.MetricsAddr != "0" {
		c.metrics, err = metricsserver.NewServer(metricsserver.Options{
			BindAddress:    cfg.MetricsAddr,
			SecureServing:  true,
			CertDir:        cfg.MetricsCertDir,
			FilterProvider: metricsAuth(cfg.Logger),
		}, rc, mgr.GetHTTPClient())
		if err != nil {
			return nil, fmt.Errorf("controller: metrics server: %w", err)
		}
		if err := mgr.Add(c.metrics); err != nil {
			return nil, err
		}
	}
	// The Runtime status counts slots from the scheduler's informer of
	// Runs, which lead attaches: one watch of Runs per process.
	c.runFeed = runtimeset.NewRunFeed()
	if err := runtimeset.Setup(mgr, runtimeset.Options{Image: cfg.Image, GatewayURL: cfg.GatewayURL, Namespace: cfg.Namespace, Logger: cfg.Logger, Runs: c.runFeed}); err != nil {
		return nil, fmt.Errorf("controller: runtime reconciler: %w", err)
	}
	// A manager.RunnableFunc runs on the leader only.
	if err := mgr.Add(manager.RunnableFunc(c.lead)); err != nil {
		return nil, err
	}
	return c, nil
}

// Elected is closed once this replica leads.
func (c *Controller) Elected() <-chan struct{} { return c.mgr.Elected() }

// MetricsAddr is the address /metrics listens on once Run has started it
// ("" before, or when disabled).
func (c *Controller) MetricsAddr() string {
	if s, ok := c.metrics.(interface{ GetBindAddr() string }); ok {
		return s.GetBindAddr()
	}
	return ""
}

// Run serves the probe socket and runs the manager until ctx ends (nil) or
// leadership is lost or a component fails (an error: exit non-zero). It
// returns once the leader's components have stopped.
func (c *Controller) Run(ctx context.Context) error {
	lis, err := probe.Listen(c.cfg.ProbeSocket)
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	probeDone := make(chan error, 1)
	go func() { probeDone <- probe.Serve(ctx, lis, c.health) }()
	c.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	err = c.mgr.Start(ctx)
	c.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	cancel()
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
	c.leading.Wait()
	if perr := <-probeDone; err == nil {
		err = perr
	}
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	return nil
}

// lead runs the leader's components until ctx ends (leadership lost, or
// the manager stopping).
func (c *Controller) lead(ctx context.Context) error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil
	}
	c.leading.Add(1)
	c.mu.Unlock()
	defer c.leading.Done()
	c.log.Info("controller: elected leader")
	c.health.SetServingStatus(ServiceLeader, healthpb.HealthCheckResponse_SERVING)
	defer c.health.SetServingStatus(ServiceLeader, healthpb.HealthCheckResponse_NOT_SERVING)

	st, err := kube.New(c.cfg.REST, kube.Options{UserAgent: userAgent, Logger: c.log})
	if err != nil {
		return err
	}
	defer st.Close()
	kc, err := kubernetes.NewForConfigAndClient(c.cfg.REST, c.mgr.GetHTTPClient())
	if err != nil {
		return err
	}
	inf := controlplane.NewInformers(st, c.log)
	// The leader leads once per process (losing the lease ends it).
	c.runFeed.Attach(inf.Runs.List, inf.Runs.Synced())
	defer inf.Runs.AddEventHandler(c.runFeed)()
	pods, err := kubepods.New(kubepods.Config{Client: kc, Runtimes: inf.Runtimes, NotReadyGrace: c.cfg.NotReadyGrace, Logger: c.log})
	if err != nil {
		return err
	}
	// The Functions' load is what the gateways' records say, summed
	// (internal/loadreport); a change pokes the autoscaler.
	var core *controlplane.Core
	loads, err := loadreport.NewReader(loadreport.ReaderConfig{Client: kc, Namespace: c.cfg.Namespace, Logger: c.log,
		OnChange: func(namespace, name string) { core.Autoscaler.Poke(namespace, name) }})
	if err != nil {
		return err
	}
	arts, artComponents, closeArts, err := c.artifacts(ctx, st)
	if err != nil {
		return err
	}
	defer closeArts()
	core, err = controlplane.New(controlplane.Config{Store: st, Informers: inf, Pods: pods, PodsSynced: pods.Synced(),
		Logger: c.log, OnScheduled: c.cfg.OnScheduled, Metrics: c.sched, FinishedRunTTL: c.cfg.FinishedRunTTL,
		FunctionLoad: loads.Load, WorkflowArtifacts: arts, SchedulerWorkers: SchedulerWorkers})
	if err != nil {
		return err
	}
	return controlplane.Run(ctx, c.log, append(append(core.Components(),
		controlplane.Component{Name: "pods", Run: pods.Run},
		controlplane.Component{Name: "gateway loads", Run: loads.Run}), artComponents...)...)
}

// schedulerMetrics are the scheduler's metrics on controller-runtime's
// registry, which /metrics serves: registered once per process (tests run
// two replicas in one), so every replica shares them; the queue depth is
// the leading replica's.
func schedulerMetrics() *controlplane.Metrics {
	m := controlplane.NewMetrics()
	if err := ctrlmetrics.Registry.Register(m); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(*controlplane.Metrics); ok {
				return existing
			}
		}
		panic(fmt.Sprintf("controller: scheduler metrics: %v", err)) // names clash: a programming error
	}
	return m
}

// artifactSweepPeriod is how often the artifacts of deleted WorkflowRuns
// and those past their retention are looked for (as in standalone).
const artifactSweepPeriod = time.Minute

// artifacts is the workflow engine's artifact copier over the S3 store
// ArtifactS3 names, and its sweep; nil and none without a bucket. The
// copies reach a step's Run through the gateway (the aggregated API,
// with the controller's identity): only runtimed's hop reaches a pod,
// and the gateway holds the hop's client certificate.
func (c *Controller) artifacts(ctx context.Context, st store.Store) (workflow.Artifacts, []controlplane.Component, func(), error) {
	if c.cfg.ArtifactS3.Bucket == "" {
		c.log.Info("controller: no artifact store (--artifact-s3-bucket); upload-artifact and download-artifact steps fail")
		return nil, nil, func() {}, nil
	}
	backend, err := artifact.NewS3(ctx, c.cfg.ArtifactS3)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("controller: %w", err)
	}
	arts := artifact.NewStore(artifact.StoreConfig{Backend: backend, Logger: c.log})
	gw, err := cluster.New(cluster.Config{REST: c.cfg.REST})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("controller: the gateway's exec: %w", err)
	}
	live := workflow.LiveWorkflowRuns(st.WorkflowRuns())
	sweep := controlplane.Component{Name: "artifact sweep", Run: func(ctx context.Context) error {
		arts.SweepEvery(ctx, artifactSweepPeriod, live, c.cfg.ArtifactRetention)
		return nil
	}}
	mover := artifact.NewMover(arts, artifact.ThroughGateway(gw.Exec()))
	return workflow.MoverArtifacts(mover), []controlplane.Component{sweep}, func() { _ = gw.Close() }, nil
}
