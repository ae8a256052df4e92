// Package sidecar is `stoke runtimed` in a Kubernetes runtime Pod, beside
// the Pod's `stoke runtime-server`: it hands the Runs assigned to its own
// Pod (and no other) to the same runtimed.Daemon standalone mode runs,
// which drives the Runtime Server over the Pod's Unix socket and writes
// the Runs' status; it renews the Pod's Lease (the Pod's heartbeat, never
// a write to Runs); it serves the invoke and exec hop for the gateway on
// the Pod IP behind mutual TLS (internal/mtls); and it answers its
// readiness probe on a Unix socket in the Pod's private run directory.
package sidecar

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/clock"

	pb "stoke.dev/stoke/api/executor/v1"
	metricsv1 "stoke.dev/stoke/api/metrics/v1"
	rdpb "stoke.dev/stoke/api/runtimed/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/gitsource"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/metricsrpc"
	"stoke.dev/stoke/internal/mtls"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/probe"
	"stoke.dev/stoke/internal/runlog"
	"stoke.dev/stoke/internal/runtime/server"
	"stoke.dev/stoke/internal/runtimed"
	"stoke.dev/stoke/internal/store"
)

// DefaultRuntimeServer is the Runtime Server's socket in a runtime Pod
// (the emptyDir both containers mount at /var/run/stoke).
const DefaultRuntimeServer = "unix:///var/run/stoke/rs.sock"

// DefaultHopPort is the port of the hop on the Pod IP.
const DefaultHopPort = 7443

// TaskRunningAfter is how long a task runs before runtimed writes it
// Running (runtimed.Config.RunningAfter): a task that ends sooner costs
// one status write (its end), not two, and so one API server update and
// one event to each watcher less; one that runs longer shows Running a
// tenth of a second late. A task's start is fenced by its directory on
// the Pod, not by the write (docs/runtimed.md "The claim").
const TaskRunningAfter = 100 * time.Millisecond

// Config configures one runtime Pod's runtimed.
type Config struct {
	// Pod is this Pod: Namespace, Name and UID from the downward API,
	// Runtime its Runtime's name, Addr the Runtime Server's gRPC target,
	// WorkspaceRoot the shared workspace.
	Pod podsource.Pod
	// Runs is the Run store (the Kubernetes store in a cluster); runtimed
	// lists and watches only the Runs assigned to Pod.UID in
	// Pod.Namespace.
	Runs store.Resource[*v1alpha1.Run]
	// Leases is the coordination/v1 Lease client of Pod.Namespace.
	Leases coordclient.LeaseInterface
	// Listen is the hop's address, "$(POD_IP):7443".
	Listen string
	// TLSDir holds the hop's server credentials (mtls).
	TLSDir string
	// ProbeSocket is the readiness probe's Unix socket (default
	// DefaultProbeSocket); its directory is made 0700.
	ProbeSocket string
	// RunLogDir is the directory the Runtime Server writes the Runs'
	// logs to (its --run-log-dir); runtimed serves them to the gateway
	// (runtimed.v1 Logs) and removes a Run's when it leaves the Pod.
	// Empty: no log service.
	RunLogDir string
	// GitCache is the directory of the pod's git cache (spec.source.git),
	// a volume of runtimed's container alone; empty: Runs with a git
	// source fail.
	GitCache string
	// StateDir is runtimed's own directory on the Pod
	// (runtimed.Config.StateDir), a volume of runtimed's container alone
	// that outlives its restarts; empty: tasks in a shared workspace are
	// claimed before they start.
	StateDir string
	// GitCredentials is the file of the Runtime's spec.git.credentialsSecret
	// (git's credential-store format), read again when the kubelet
	// replaces it; GitCredentialsSecret is that Secret's name, which a
	// Run's source.git.credentialsSecret must give to fetch with them
	// (runtimed.Config.GitSecret). Both empty: no credentials.
	GitCredentials       string
	GitCredentialsSecret string
	// EndpointBase is the gateway's base URL under which a Ready
	// function's status.endpoint is its invoke URL; empty gives the path
	// alone.
	EndpointBase string
	// The Runtime's default task and function timeouts (runtimed.Config).
	DefaultTaskTimeout     time.Duration
	DefaultFunctionTimeout time.Duration
	// StatusPoll is runtimed's FunctionStatus cadence (default 1 s).
	StatusPoll time.Duration
	// LeaseDuration and RenewInterval default to DefaultLeaseDuration and
	// DefaultRenewInterval.
	LeaseDuration time.Duration
	RenewInterval time.Duration
	// ShutdownGrace is how long calls through the hop may finish after
	// ctx ends (default 5 s).
	ShutdownGrace time.Duration
	Logger        *slog.Logger
	Clock         clock.WithTicker
}

func (c *Config) validate() error {
	var missing []string
	for name, v := range map[string]string{"pod namespace": c.Pod.Namespace, "pod name": c.Pod.Name, "pod uid": c.Pod.UID,
		"runtime server address": c.Pod.Addr, "workspace root": c.Pod.WorkspaceRoot, "hop listen address": c.Listen, "TLS directory": c.TLSDir} {
		if v == "" {
			missing = append(missing, name)
		}
	}
	if c.Runs == nil {
		missing = append(missing, "run store")
	}
	if c.Leases == nil {
		missing = append(missing, "lease client")
	}
	if len(missing) > 0 {
		return fmt.Errorf("runtimed: missing %s", strings.Join(missing, ", "))
	}
	return nil
}

// Run serves until ctx ends. It waits for the Runtime Server before it
// takes Runs; the Lease, the hop and the probe start at once (the probe
// answers not ready until everything is).
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	cfg.Logger = logging.OrDiscard(cfg.Logger)
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.ProbeSocket == "" {
		cfg.ProbeSocket = DefaultProbeSocket
	}
	if cfg.LeaseDuration <= 0 {
		cfg.LeaseDuration = DefaultLeaseDuration
	}
	if cfg.RenewInterval <= 0 {
		cfg.RenewInterval = DefaultRenewInterval
	}
	if cfg.ShutdownGrace <= 0 {
		cfg.ShutdownGrace = 5 * time.Second
	}
	log := cfg.Logger.With("pod", cfg.Pod.Namespace+"/"+cfg.Pod.Name)

	tlsCfg, err := mtls.ServerConfig(cfg.TLSDir)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(cfg.Pod.Addr, server.DialOptions()...)
	if err != nil {
		return fmt.Errorf("runtime server %s: %w", cfg.Pod.Addr, err)
	}
	defer conn.Close()
	hopLis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("hop: %w", err)
	}
	defer hopLis.Close()
	probeLis, err := probe.Listen(cfg.ProbeSocket)
	if err != nil {
		return err
	}
	defer probeLis.Close()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lease := &leaseRenewer{
		leases: cfg.Leases, name: cfg.Pod.Name, holder: cfg.Pod.UID,
		owner:    metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: cfg.Pod.Name, UID: types.UID(cfg.Pod.UID)},
		duration: cfg.LeaseDuration, interval: cfg.RenewInterval, clock: cfg.Clock, log: log,
	}
	runs := informer.New(cfg.Runs, informer.Options{Namespace: cfg.Pod.Namespace, AssignedPodUID: cfg.Pod.UID, Logger: log})
	// The Runs placed on this Pod at their create (a Function's
	// replicas), which it takes before anything is written to them: they
	// are in runs only from their first write, its own claim.
	placed := informer.New(cfg.Runs, informer.Options{Namespace: cfg.Pod.Namespace, PlacedPodUID: cfg.Pod.UID, Logger: log})
	var logs *runlog.Store
	if cfg.RunLogDir != "" {
		if logs, err = runlog.New(cfg.RunLogDir, log); err != nil {
			return err
		}
	}
	var git *gitsource.Cache
	if cfg.GitCache != "" {
		var creds gitsource.Credentials
		if cfg.GitCredentials != "" {
			f, err := gitsource.OpenCredentialsFile(cfg.GitCredentials)
			if err != nil {
				return err
			}
			creds = f
		}
		if git, err = gitsource.New(gitsource.Config{Dir: cfg.GitCache, Credentials: creds, Logger: log}); err != nil {
			return err
		}
	}
	metrics := runtimed.NewMetrics(func() []v1alpha1.Phase {
		var phases []v1alpha1.Phase
		for _, r := range runs.List(nil) {
			phases = append(phases, r.Status.Phase)
		}
		return phases
	})
	d := runtimed.Start(ctx, runtimed.Config{
		Pod: cfg.Pod, Runs: cfg.Runs, Conn: conn, Logger: cfg.Logger, StatusPoll: cfg.StatusPoll, RunLogs: logs, Metrics: metrics,
		DefaultTaskTimeout: cfg.DefaultTaskTimeout, DefaultFunctionTimeout: cfg.DefaultFunctionTimeout,
		Endpoint: endpoint(cfg.EndpointBase), Git: git, GitSecret: &cfg.GitCredentialsSecret,
		RunningAfter: TaskRunningAfter, StateDir: cfg.StateDir,
	})
	defer d.Stop()
	health := healthpb.NewHealthClient(conn)
	rsHealthy := func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, rsCheckTimeout)
		defer cancel()
		return checkRuntimeServer(ctx, health, false)
	}

	ready := &readiness{checks: []func(context.Context) error{
		func(context.Context) error {
			// Not the placed Runs' informer: without it (an API server
			// whose Run CRD lacks the selectable field) placed Runs are
			// assigned by the scheduler, a moment later.
			if !runs.HasSynced() {
				return errors.New("the Run informer has not synced yet")
			}
			return nil
		},
		rsHealthy,
		func(context.Context) error { return lease.Fresh() },
	}}
	hop := NewHop(log, d.Daemon, tlsCfg, logs, metrics)

	errc := make(chan error, 8)
	var running int
	start := func(name string, f func(context.Context) error) {
		running++
		go func() {
			err := f(ctx)
			if err != nil && ctx.Err() == nil {
				err = fmt.Errorf("%s: %w", name, err)
			} else {
				err = nil
			}
			errc <- err
		}()
	}
	start("lease", lease.Run)
	if logs != nil {
		start("logs", logs.Run)
	}
	start("hop", func(ctx context.Context) error { return hop.Serve(ctx, hopLis, cfg.ShutdownGrace, nil) })
	start("probe", func(ctx context.Context) error { return probe.Serve(ctx, probeLis, ready) })
	// Runs are taken only once the Runtime Server answers.
	rsUp := make(chan struct{})
	start("runs", func(ctx context.Context) error {
		if err := waitRuntimeServer(ctx, health, log); err != nil {
			return nil // ctx ended
		}
		close(rsUp)
		runs.AddEventHandler(d.Handler())
		return runs.Run(ctx)
	})
	start("placed runs", func(ctx context.Context) error {
		select {
		case <-rsUp:
		case <-ctx.Done():
			return nil
		}
		placed.AddEventHandler(d.PlacedHandler())
		return placed.Run(ctx)
	})
	start("adopt", func(ctx context.Context) error {
		// What a previous runtimed of this Pod (a restarted container)
		// claimed and left running.
		if err := runs.WaitForSync(ctx); err != nil {
			return nil
		}
		d.Adopt(runs.List(nil))
		return nil
	})
	log.Info("runtimed started", "hop", hopLis.Addr().String(), "probe", cfg.ProbeSocket, "runtime_server", cfg.Pod.Addr)

	var first error
	for range running {
		if err := <-errc; err != nil && first == nil {
			first = err
			log.Error("runtimed component failed", "error", err)
			cancel()
		}
	}
	return first
}

// endpoint is a Ready function's invoke URL under the gateway.
func endpoint(base string) func(run *v1alpha1.Run) string {
	return func(run *v1alpha1.Run) string {
		return fmt.Sprintf("%s/v1/namespaces/%s/runs/%s/%s/invoke", strings.TrimSuffix(base, "/"), run.Namespace, run.Name, run.UID)
	}
}

// checkRuntimeServer asks the Runtime Server's health service about
// executor.v1.Runtime, waiting for a connection when wait is set.
func checkRuntimeServer(ctx context.Context, health healthpb.HealthClient, wait bool) error {
	resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: pb.Runtime_ServiceDesc.ServiceName}, grpc.WaitForReady(wait))
	if err != nil {
		return fmt.Errorf("the runtime server does not answer: %s", status.Convert(err).Message())
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("the runtime server is %s", resp.GetStatus())
	}
	return nil
}

// waitRuntimeServer returns once the Runtime Server is SERVING, or ctx's
// error.
func waitRuntimeServer(ctx context.Context, health healthpb.HealthClient, log *slog.Logger) error {
	backoff := 50 * time.Millisecond
	for n := 0; ; n++ {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := checkRuntimeServer(cctx, health, true)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if n%20 == 0 {
			log.Info("waiting for the runtime server", "error", err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// NewHop is the gateway's hop into this Pod: the FunctionRuntime proxy and
// the exec service of d, when logs is set the Runs' logs (runtimed.v1
// Logs), and when metrics is set runtimed's metrics (metrics.v1, which the
// gateway scrapes), behind mutual TLS with tlsCfg (mtls.ServerConfig),
// with the Runtime Server's interceptors (error categories as status
// codes, panic recovery, call logs).
func NewHop(log *slog.Logger, d *runtimed.Daemon, tlsCfg *tls.Config, logs *runlog.Store, metrics *runtimed.Metrics) *server.GRPC {
	opts := []grpc.ServerOption{grpc.Creds(credentials.NewTLS(tlsCfg))}
	if metrics != nil {
		// After the server's own interceptors: innermost.
		opts = append(opts, grpc.ChainUnaryInterceptor(metrics.Unary()))
	}
	g := server.NewGRPC(log, server.Services{Functions: d.Proxy(), Exec: exec.NewGRPCServer(d.Exec())}, opts...)
	if logs != nil {
		rdpb.RegisterLogsServer(g.Server, d.LogService(logs))
	}
	if metrics != nil {
		metricsv1.RegisterMetricsServiceServer(g.Server, metricsrpc.NewServer(metrics.Gatherer()))
	}
	return g
}
