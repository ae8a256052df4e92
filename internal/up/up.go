// Package up runs `stoke up`: the standalone control plane behind the HTTP
// gateway, with the API token from the data directory and optional TLS,
// until its context ends.
package up

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"sync"
	"syscall"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/artifact"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/cgroup"
	"stoke.dev/stoke/internal/controlplane"
	"stoke.dev/stoke/internal/datadir"
	"stoke.dev/stoke/internal/debugsock"
	"stoke.dev/stoke/internal/docker"
	"stoke.dev/stoke/internal/gateway"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/probe"
	"stoke.dev/stoke/internal/proc"
	"stoke.dev/stoke/internal/runuser"
	"stoke.dev/stoke/internal/standalone"
	"stoke.dev/stoke/internal/version"
)

// Config configures `stoke up`.
type Config struct {
	DataDir string
	// Listen is the HTTP API's address; port 0 picks a free one.
	Listen string
	// TLSCert and TLSKey, both set, serve HTTPS.
	TLSCert, TLSKey string
	// InsecureListenTrustedNetwork allows plain HTTP on an address that is
	// not loopback, where the bearer token crosses the network in clear
	// text; without it such a Listen is refused at start.
	InsecureListenTrustedNetwork bool
	Logger                       *slog.Logger
	// PodCommand overrides how pods are started (tests); nil runs this
	// executable.
	PodCommand func(pod podsource.Pod, args []string) *exec.Cmd
	// DefaultRuntimes are created on first start; nil means
	// standalone.DefaultRuntimes().
	DefaultRuntimes []*v1alpha1.Runtime
	// ShutdownTimeout bounds the wait for HTTP requests in flight at stop.
	ShutdownTimeout time.Duration
	// Ready, when set, is called once the API serves, with its base URL.
	Ready func(url string)
	// FinishedRunTTL is how long a finished Run that sets no
	// ttlSecondsAfterFinished is kept; zero keeps it until deleted. The
	// command's default is controlplane.DefaultFinishedRunTTL.
	FinishedRunTTL time.Duration
	// ArtifactRetention is how long a workflow artifact is kept at most
	// (0: bounds.ArtifactRetentionDefault).
	ArtifactRetention time.Duration
	// ArtifactS3: see standalone.Config (--artifact-s3-*).
	ArtifactS3 artifact.S3Config
	// LambdaCollectInterval: see standalone.Config.
	LambdaCollectInterval time.Duration
	// HTTPTimeouts bound slow clients; zero fields take
	// gateway.DefaultTimeouts.
	HTTPTimeouts gateway.Timeouts
	// Subreaper makes stoke up the child subreaper of its pods: what a pod
	// killed with SIGKILL leaves running outside its session (a process
	// that called setsid) is orphaned to stoke up, which kills it. `stoke
	// up` sets it; a test that runs Run in its own process must not, as
	// its other children would be taken for orphans.
	Subreaper bool
	// DebugSocket, when set, is the Unix socket stoke up serves Go's
	// profiles on (internal/debugsock; its directory is made 0700), and
	// each pod's Runtime Server then serves its own in its pod directory
	// (pool.DebugSocketName). The command's default is
	// datadir.DebugSocket; empty serves none.
	DebugSocket string
	// Containment (with Subreaper) is cgroup.Auto to run the pods in a
	// cgroup v2 of stoke up's own, <own cgroup>/stoke-<hash of the data
	// directory>, each pod and each task in a child group, where the host
	// delegates a writable one with cgroup.kill; cgroup.Subreaper (or
	// empty) for the subreaper alone.
	Containment cgroup.Mode
	// DockerSocket, when set, is the Unix socket the Docker Engine API is
	// served on (internal/docker; its directory is made 0700). The
	// command's default is datadir.DockerSocket; empty serves none.
	DockerSocket string
	// DockerImages, when set, is the file of the image → Runtime table
	// (docker.LoadImages); empty: docker.DefaultImages.
	DockerImages string
	// RunAs, when set, is the unprivileged user the Runs' processes run
	// as (tasks, handlers, exec sessions); stoke up must be root. The
	// data directory and its runs and scratch directories are then
	// passages it can go through, not list (internal/runuser); the token,
	// the store, the logs and the pods' sockets stay out of its reach.
	// The command sets it whenever stoke up is root; nil runs the Runs as
	// stoke up's own user.
	RunAs *runuser.User
	// GitCredentials is the file of credentials for spec.source.git
	// (git's credential-store format); "" sends none.
	GitCredentials string
}

var _ gateway.API = (*standalone.Standalone)(nil)

// Run serves until ctx ends, then stops accepting requests, stops the
// control plane and its pods, and returns.
func Run(ctx context.Context, cfg Config) error {
	cfg.Logger = logging.OrDiscard(cfg.Logger)
	if cfg.Listen == "" {
		cfg.Listen = datadir.DefaultListen
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 10 * time.Second
	}
	if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	if cfg.ArtifactRetention < 0 || cfg.ArtifactRetention > bounds.ArtifactRetention {
		return fmt.Errorf("--artifact-retention %s: between 0 (the default, %s) and %s", cfg.ArtifactRetention, bounds.ArtifactRetentionDefault, bounds.ArtifactRetention)
	}
	if cfg.FinishedRunTTL < 0 {
		return fmt.Errorf("--finished-run-ttl %s is negative; 0 keeps finished Runs", cfg.FinishedRunTTL)
	}
	if cfg.RunAs != nil && os.Geteuid() != 0 {
		return fmt.Errorf("--run-as-user %s: stoke up runs as uid %d, and only root can run the Runs as another user", cfg.RunAs, os.Geteuid())
	}
	dataDir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	if err := datadir.Prepare(dataDir, cfg.RunAs); err != nil {
		return err
	}
	// Before binding: a second stoke up on this directory says who serves
	// it rather than failing on a port in use.
	unlock, err := datadir.Lock(dataDir)
	if err != nil {
		return err
	}
	defer unlock()
	token, err := datadir.EnsureToken(dataDir)
	if err != nil {
		return err
	}
	// After the lock: a second stoke up must not replace the first's
	// socket.
	if cfg.DebugSocket != "" {
		debug, err := debugsock.Listen(cfg.DebugSocket)
		if err != nil {
			return err
		}
		defer debug.Close()
	}
	var tlsConf *tls.Config
	scheme := "http"
	if cfg.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return fmt.Errorf("loading the TLS certificate: %w", err)
		}
		tlsConf = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		scheme = "https"
	}
	lis, err := net.Listen("tcp", cfg.Listen)
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("listening for the HTTP API: %s is in use by another program (this data directory is not served yet); stop that program or pass another --listen address", cfg.Listen)
	}
	if err != nil {
		return fmt.Errorf("listening for the HTTP API: %w", err)
	}
	if tlsConf == nil && !isLoopback(lis.Addr()) {
		if !cfg.InsecureListenTrustedNetwork {
			lis.Close()
			return fmt.Errorf("refusing to serve plain HTTP on %s, which is not a loopback address: the bearer token would cross the network in clear text; "+
				"serve HTTPS (--tls-cert and --tls-key), listen on 127.0.0.1, or pass --%s if every host on this network is trusted", lis.Addr(), InsecureListenFlag)
		}
		cfg.Logger.Warn("serving plain HTTP on a non-loopback address: the bearer token crosses the network in clear text; --"+InsecureListenFlag+" says this network is trusted",
			"listen", lis.Addr().String())
	}
	if tlsConf != nil {
		lis = tls.NewListener(lis, tlsConf)
	}
	lis = gateway.Listener(lis)
	url := scheme + "://" + lis.Addr().String()

	if cfg.Subreaper {
		// No scopes: stoke up starts nothing but pods, so every orphan is
		// what a dead pod left, and is killed when found.
		reaper, err := proc.NewSubreaper(cfg.Logger)
		if err != nil {
			lis.Close()
			return err
		}
		rctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = reaper.Run(rctx)
		}()
		defer func() {
			cancel()
			<-done
			if err := reaper.Sweep(2 * time.Second); err != nil {
				cfg.Logger.Warn("orphans left at exit", "error", err)
			}
		}()
	}
	var pods *cgroup.Group
	if cfg.Subreaper && cfg.Containment == cgroup.Auto {
		if pods, err = ownCgroup(dataDir); err != nil {
			cfg.Logger.Info("no cgroup v2 of our own; containment by the subreaper alone", "reason", err)
			pods = nil
		} else {
			cfg.Logger.Info("pods and tasks run in cgroups v2 of their own", "cgroup", pods.Path())
			// Runs after the pods are stopped (deferred before the control
			// plane starts): whatever is still in the group goes too.
			defer func() {
				if err := pods.Remove(); err != nil {
					cfg.Logger.Warn("cannot remove the pods' cgroup", "error", err)
				}
			}()
		}
	}
	var s *standalone.Standalone
	metrics := gateway.NewMetrics(func() map[v1alpha1.Phase]int { return s.RunPhases() })
	schedMetrics := controlplane.NewMetrics()
	metrics.MustRegister(schedMetrics)
	s, err = standalone.New(ctx, standalone.Config{DataDir: dataDir, Logger: cfg.Logger, PodCommand: cfg.PodCommand,
		DefaultRuntimes: cfg.DefaultRuntimes, EndpointBase: url, Metrics: schedMetrics,
		FinishedRunTTL: cfg.FinishedRunTTL, ArtifactRetention: cfg.ArtifactRetention, ArtifactS3: cfg.ArtifactS3, LambdaCollectInterval: cfg.LambdaCollectInterval, Cgroup: pods,
		DebugSockets: cfg.DebugSocket != "", RunAs: cfg.RunAs, GitCredentials: cfg.GitCredentials})
	if err != nil {
		lis.Close()
		return err
	}
	metrics.Include(s.PodMetrics())
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srv := gateway.New(gateway.Config{API: s, Exec: s, Functions: s.Functions(), Artifacts: s.ArtifactReader(), Token: token, Metrics: metrics, Logger: cfg.Logger, Timeouts: cfg.HTTPTimeouts}).Server()
	// Streams (watch, logs -f) end when the server stops.
	srv.BaseContext = func(net.Listener) context.Context { return ctx }
	planeDone := make(chan error, 1)
	go func() { planeDone <- s.Run(ctx) }()
	if cfg.DockerSocket != "" {
		stopDocker, err := serveDocker(ctx, cfg, s)
		if err != nil {
			cancel()
			<-planeDone
			lis.Close()
			return err
		}
		defer stopDocker()
	}
	serveDone := make(chan error, 1)
	go func() { serveDone <- srv.Serve(lis) }()
	if err := datadir.WriteURL(dataDir, url); err != nil {
		cfg.Logger.Warn("clients on this machine will need --server", "error", err)
	}
	cfg.Logger.Info("serving", "url", url, "data_dir", dataDir, "token_file", datadir.TokenPath(dataDir), "debug_socket", cfg.DebugSocket,
		"run_as_user", cfg.RunAs.String(), "gomaxprocs", goruntime.GOMAXPROCS(0))
	if cfg.Ready != nil {
		cfg.Ready(url)
	}

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-planeDone:
		planeDone <- runErr
		if runErr == nil {
			runErr = errors.New("the control plane stopped")
		}
	case runErr = <-serveDone:
		serveDone <- runErr
		runErr = fmt.Errorf("serving the HTTP API: %w", runErr)
	}
	cfg.Logger.Info("stopping")
	cancel()
	sctx, scancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer scancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	<-serveDone
	if err := <-planeDone; err != nil && runErr == nil {
		runErr = err
	}
	return runErr
}

// serveDocker serves the Docker Engine API on cfg.DockerSocket until the
// returned function is called.
func serveDocker(ctx context.Context, cfg Config, s *standalone.Standalone) (func(), error) {
	images := docker.DefaultImages()
	if cfg.DockerImages != "" {
		var err error
		if images, err = docker.LoadImages(cfg.DockerImages); err != nil {
			return nil, err
		}
	}
	lis, err := probe.ListenPrivate("docker socket", cfg.DockerSocket)
	if err != nil {
		return nil, err
	}
	d := docker.New(docker.Config{Backend: s, Logs: gateway.StoreLogReader(s, 250*time.Millisecond), Images: images,
		Version: version.Get().Version, Logger: cfg.Logger})
	srv := &http.Server{Handler: d, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		// The Docker API reads containers from the Run cache: until it
		// has synced, `docker ps` after a restart would list none and a
		// name would be "no such container". Clients that connect
		// meanwhile wait in the listener's backlog.
		if s.WaitRunsSynced(ctx) != nil {
			return
		}
		_ = srv.Serve(lis)
	}()
	go func() {
		defer wg.Done()
		_ = d.Run(ctx)
	}()
	cfg.Logger.Info("serving the Docker API", "socket", cfg.DockerSocket)
	return func() {
		cancel()
		_ = srv.Close()
		wg.Wait()
	}, nil
}

// InsecureListenFlag is the flag of Config.InsecureListenTrustedNetwork,
// named in the refusal.
const InsecureListenFlag = "insecure-listen-trusted-network"

// isLoopback reports whether addr, a bound listener's, takes connections
// only from this host. A wildcard address (0.0.0.0, ::) is not loopback.
func isLoopback(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}

// ownCgroup makes (or finds, after a predecessor on the same data
// directory died) the cgroup v2 that stoke up on dataDir runs its pods in:
// a child of its own cgroup named after the data directory, so that a
// restart finds the one its predecessor used.
func ownCgroup(dataDir string) (*cgroup.Group, error) {
	own, err := cgroup.Detect()
	if err != nil {
		return nil, err
	}
	return own.Child(CgroupName(dataDir))
}

// CgroupName is the name of the cgroup, under its own, in which stoke up
// on the absolute data directory dataDir runs its pods.
func CgroupName(dataDir string) string {
	sum := sha256.Sum256([]byte(dataDir))
	return "stoke-" + hex.EncodeToString(sum[:8])
}
