// Package kubegateway is `stoke gateway`, Kubernetes mode's front door for
// invocations, exec sessions and Run logs. It serves the routes of
// standalone's gateway from the same code (internal/gateway) over HTTPS;
// what differs is behind that package's small interfaces: callers are
// authenticated and authorized by the API server (TokenReview and
// SubjectAccessReview, cached briefly), Runs and runtime Pods are routed
// from informers in memory, Functions' invocations are queued and
// dispatched over their replicas as in standalone (internal/dispatch,
// with each Function's queue bounds from its object), and each call goes
// once to the owner Pod's runtimed over the mutual-TLS hop
// (internal/mtls), never retried after dispatch. Its Functions' loads go
// to the controller's autoscaler in a record of its own
// (internal/loadreport).
package kubegateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	certutil "k8s.io/client-go/util/cert"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/artifact"
	"stoke.dev/stoke/internal/dispatch"
	"stoke.dev/stoke/internal/gateway"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/loadreport"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/metricsrpc"
	"stoke.dev/stoke/internal/mtls"
	"stoke.dev/stoke/internal/runtime/server"
	"stoke.dev/stoke/internal/runtimeset"
	"stoke.dev/stoke/internal/store/kube"
	"stoke.dev/stoke/internal/workflow"
)

// DefaultHopPort is runtimed's hop port on a runtime Pod's IP.
const DefaultHopPort = 7443

// Config configures the gateway.
type Config struct {
	// REST reaches the API server with the gateway's own identity.
	REST *rest.Config
	// Listen is the HTTPS address.
	Listen string
	// CertFile and KeyFile are the serving certificate; both empty: a
	// self-signed one is made at start, which the API server cannot
	// verify (the chart's APIService then skips verifying it).
	CertFile, KeyFile string
	// HopTLSDir holds the gateway's client certificate for runtimed's
	// hop (the Secret stoke-gateway-tls: ca.crt, tls.crt, tls.key).
	HopTLSDir string
	// HopPort is runtimed's port (default DefaultHopPort).
	HopPort int
	// FrontProxy serves callers the API server proxies to the gateway as
	// the aggregated API gateway.stoke.dev/v1alpha1, trusting their
	// identity headers when the client certificate is the front proxy's
	// as kube-system/extension-apiserver-authentication says (frontProxy).
	FrontProxy bool
	// AuthTTL is how long a decision is kept (at most and by default
	// MaxDecisionTTL); AuthClock is the caches' clock (tests).
	AuthTTL time.Duration
	// TokenAudiences are AuthConfig.Audiences (--token-audiences).
	TokenAudiences []string
	AuthClock      cache.Clock
	// ShutdownGrace is how long requests in flight may finish after ctx
	// ends (default 10 s).
	ShutdownGrace time.Duration
	Timeouts      gateway.Timeouts
	// Docker, when Docker.Listen is set, serves the Docker Engine API on
	// a port of its own (docker.go).
	Docker DockerConfig
	Logger *slog.Logger
	// OnListen, when set, is told the bound address.
	OnListen func(net.Addr)
	// ArtifactS3 is the workflow artifact store `stoke controller` writes
	// (internal/artifact's S3 backend); with a Bucket the gateway serves
	// WorkflowRuns' artifacts from it (`stoke artifacts`), without one
	// those routes are not served.
	ArtifactS3 artifact.S3Config
	// Pod is the gateway's own Pod (the downward API's POD_NAMESPACE,
	// POD_NAME and POD_UID): its Function load record is written there
	// (internal/loadreport) for the autoscaler. Without a name, no record
	// is written and the autoscaler sees none of this gateway's load.
	Pod PodIdentity
}

// PodIdentity names a Pod.
type PodIdentity struct {
	Namespace, Name string
	UID             types.UID
}

// Run serves until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	if cfg.REST == nil || cfg.Listen == "" || cfg.HopTLSDir == "" {
		return errors.New("gateway: the API server, the listen address and the hop's TLS directory are required")
	}
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return errors.New("gateway: give both --tls-cert-file and --tls-private-key-file, or neither")
	}
	log := logging.OrDiscard(cfg.Logger)
	if cfg.HopPort <= 0 {
		cfg.HopPort = DefaultHopPort
	}
	if cfg.ShutdownGrace <= 0 {
		cfg.ShutdownGrace = 10 * time.Second
	}
	serving, reloadCert, err := servingConfig(cfg.CertFile, cfg.KeyFile, cfg.FrontProxy, log)
	if err != nil {
		return err
	}
	hopTLS, err := mtls.ClientConfig(cfg.HopTLSDir)
	if err != nil {
		return err
	}
	rc := rest.CopyConfig(cfg.REST)
	rc.UserAgent = "stoke-gateway"
	rc.QPS, rc.Burst = 100, 200 // reviews on a cold cache; the hot path asks nothing
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	st, err := kube.New(rc, kube.Options{UserAgent: "stoke-gateway", Logger: log})
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}

	runs := informer.New(st.Runs(), runInformerOptions(cfg, log))
	hops := newHops(strconv.Itoa(cfg.HopPort), func(addr string) (*grpc.ClientConn, error) {
		return grpc.NewClient(addr, append(server.DialOptions(), grpc.WithTransportCredentials(credentials.NewTLS(hopTLS)))...)
	})
	defer hops.close()
	pods := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = runtimeset.LabelName + "=" + runtimeset.NameRuntimePod
	})).Core().V1().Pods().Informer()
	if _, err := pods.AddEventHandler(podHandler(hops)); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}

	var proxy *frontProxy
	ac := AuthConfig{Client: client, TTL: cfg.AuthTTL, Clock: cfg.AuthClock, Audiences: cfg.TokenAudiences, Logger: log}
	if cfg.FrontProxy {
		if proxy, err = newFrontProxy(client); err != nil {
			return err
		}
		if err := proxy.load(ctx); err != nil {
			log.Warn("gateway: cannot read the front proxy's configuration yet; proxied callers are refused until it can", "configmap", authConfigMapNamespace+"/"+authConfigMapName, "error", err)
		}
		ac.FrontProxy = proxy
	}
	auth := NewAuthorizer(ac)
	metrics := gateway.NewMetrics(nil)
	metrics.MustRegister(auth.Collector())
	// runtimed's metrics, from every runtime Pod over the hop's mutual
	// TLS (metrics.v1): no runtime Pod opens a port for them.
	metrics.Include(metricsrpc.NewGatherer(hops.targets, podScrapeTimeout, log).WithUp(
		"stoke_runtimed_up", "Whether the last scrape of a runtime Pod's runtimed metrics over its hop succeeded."))
	rt := &routes{runs: runs, hops: hops}
	// Each gateway replica dispatches a Function's invocations over all
	// its replicas; between gateways a replica's one invocation in flight
	// (seed 000) is the arbiter: a replica busy with the other gateway's
	// call refuses before running it, and the invocation goes back to the
	// front of this gateway's queue (docs/http-api.md). The Function
	// objects give the queue's bounds, and a Function at zero replicas
	// exists (its invocations wait while it scales from zero).
	fnObjs := informer.New(st.Functions(), informer.Options{Logger: log})
	var loads *loadreport.Writer
	var disp *dispatch.Dispatcher
	disp = dispatch.New(dispatch.Config{OnQueue: func(k dispatch.Key) {
		// Scale from zero, or every replica gone: the autoscaler hears of
		// it at once, not at the next period.
		if loads != nil && disp.Load(k).Taking == 0 {
			loads.Poke()
		}
	}})
	fns := gateway.NewFunctions(gateway.FunctionsConfig{Hop: rt.hop, Dispatcher: disp,
		Synced:   func() bool { return runs.HasSynced() && fnObjs.HasSynced() },
		Function: gateway.FunctionSettings(fnObjs), Fetch: gateway.FunctionFetch(fnObjs)})
	runs.AddEventHandler(fns.Handler())
	fnObjs.AddEventHandler(fns.FunctionHandler())
	if cfg.Pod.Name != "" && cfg.Pod.Namespace != "" {
		loads, err = loadreport.NewWriter(loadreport.WriterConfig{Leases: client.CoordinationV1().Leases(cfg.Pod.Namespace),
			Pod: cfg.Pod.Name, PodUID: cfg.Pod.UID, Loads: functionLoads(disp), Logger: log})
		if err != nil {
			return fmt.Errorf("gateway: %w", err)
		}
	} else {
		log.Warn("gateway: its Pod is not known (POD_NAMESPACE, POD_NAME); the autoscaler does not see this gateway's Function load")
	}
	var arts gateway.Artifacts
	if cfg.ArtifactS3.Bucket != "" {
		backend, err := artifact.NewS3(ctx, cfg.ArtifactS3)
		if err != nil {
			return fmt.Errorf("gateway: %w", err)
		}
		arts = artifact.Reader{Store: artifact.NewStore(artifact.StoreConfig{Backend: backend, Logger: log}),
			Lookup: workflow.ArtifactLookup(st.WorkflowRuns())}
	}
	g := gateway.New(gateway.Config{
		Router: rt, Exec: rt, Functions: fns, Logs: rt, Auth: auth, Artifacts: arts, Metrics: metrics, Logger: log, Timeouts: cfg.Timeouts, Aggregated: true,
		Ready: func(context.Context) error {
			if !runs.HasSynced() || !pods.HasSynced() || !fnObjs.HasSynced() {
				return errors.New("the Run, Function and Pod informers have not synced yet")
			}
			return nil
		},
	})
	var dp *dockerPort
	if cfg.Docker.Listen != "" {
		b := newDockerBackend(ctx, rt, st.Runs(), st.Runtimes(), runs)
		if dp, err = newDockerPort(cfg.Docker, serving, client, auth, b, log); err != nil {
			return err
		}
		defer dp.lis.Close()
	}
	raw, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	srv, lis := httpsServer(g, raw, serving)
	if cfg.OnListen != nil {
		cfg.OnListen(raw.Addr())
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srv.BaseContext = func(net.Listener) context.Context { return ctx } // streams end when the server stops

	errc := make(chan error, 7)
	waits := 3
	if proxy != nil {
		waits++
		go func() { errc <- proxy.Run(ctx) }()
	}
	if dp != nil {
		waits++
		go func() { errc <- dp.Run(ctx) }()
	}
	go func() { errc <- runs.Run(ctx) }()
	go func() { errc <- fnObjs.Run(ctx) }()
	if loads != nil {
		waits++
		go func() { errc <- loads.Run(ctx) }()
	}
	go func() { pods.RunWithContext(ctx); errc <- nil }()
	go func() { errc <- srv.Serve(lis) }()
	reloaded := make(chan struct{})
	if reloadCert != nil {
		go func() {
			defer close(reloaded)
			reloadCert.Run(ctx)
		}()
	} else {
		close(reloaded)
	}
	defer func() { <-reloaded }()
	log.Info("gateway serving", "addr", raw.Addr().String(), "hop_port", cfg.HopPort, "gomaxprocs", runtime.GOMAXPROCS(0))

	var first error
	select {
	case <-ctx.Done():
	case first = <-errc:
		if first == nil {
			first = errors.New("gateway: a component stopped")
		}
	}
	cancel()
	sctx, scancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
	defer scancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	for range waits {
		<-errc
	}
	if errors.Is(first, context.Canceled) {
		first = nil
	}
	return first
}

// functionLoads is the dispatcher's loads as a load record shows them:
// the Functions with load.
func functionLoads(d *dispatch.Dispatcher) func() loadreport.Report {
	return func() loadreport.Report {
		rep := loadreport.Report{}
		for k, l := range d.Loads() {
			if l.InFlight+l.Queued > 0 {
				rep[loadreport.Key(k.Namespace, k.Name)] = loadreport.Load{InFlight: l.InFlight, Queued: l.Queued}
			}
		}
		return rep
	}
}

// runInformerOptions selects the Runs the gateway keeps in memory: the
// Ready ones, which are all that invoke routes to (a Function's replicas
// and function Runs by their URL), so that task Runs' events cost the
// gateways, and the API server sending them, nothing. Exec and logs of a
// Run outside that set, session starts, read it from the API server
// (informer.Informer.Fetch). The Docker port lists and watches every Run
// (docker ps), so a gateway that serves it keeps them all.
func runInformerOptions(cfg Config, log *slog.Logger) informer.Options {
	opts := informer.Options{Logger: log}
	if cfg.Docker.Listen == "" {
		opts.Phase = v1alpha1.PhaseReady
	}
	return opts
}

// podScrapeTimeout bounds the scrape of one runtime Pod's metrics.
const podScrapeTimeout = 2 * time.Second

// servingConfig is the HTTPS side: the files' certificate, reloaded when
// they change (the returned servingCert's Run watches them), or a
// self-signed one (no servingCert). With clientCerts it asks for a client
// certificate (the API server's front proxy sends one), which the front
// proxy's authenticator verifies, not TLS: other callers have none.
// HTTP/1.1 only: net/http speaks HTTP/2 on a *tls.Conn alone, which
// gateway.Listener's wrapper hides (withTLSState).
func servingConfig(certFile, keyFile string, clientCerts bool, log *slog.Logger) (*tls.Config, *servingCert, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
	if clientCerts {
		cfg.ClientAuth = tls.RequestClientCert
	}
	if certFile != "" {
		sc, err := newServingCert(certFile, keyFile, log)
		if err != nil {
			return nil, nil, err
		}
		cfg.GetCertificate = sc.GetCertificate
		return cfg, sc, nil
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("stoke-gateway", nil, nil)
	if err == nil {
		var cert tls.Certificate
		if cert, err = tls.X509KeyPair(certPEM, keyPEM); err == nil {
			cfg.Certificates = []tls.Certificate{cert}
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("gateway: serving certificate: %w", err)
	}
	return cfg, nil, nil
}

// podHandler keeps hops up to date with the runtime Pods.
func podHandler(h *hops) toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { setPod(h, obj) },
		UpdateFunc: func(_, obj any) { setPod(h, obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				h.remove(string(p.UID))
			}
		},
	}
}

func setPod(h *hops, obj any) {
	if p, ok := obj.(*corev1.Pod); ok {
		h.set(p)
	}
}

// httpsServer is g's server and its listener on raw, with serving.
func httpsServer(g *gateway.Gateway, raw net.Listener, serving *tls.Config) (*http.Server, net.Listener) {
	srv := g.Server()
	withTLSState(srv)
	// The JSON answers to malformed requests sit above TLS, where the
	// bytes are plain.
	return srv, gateway.Listener(tls.NewListener(raw, serving))
}

// tlsConnKey holds a connection's *tls.Conn in its context.
type tlsConnKey struct{}

// withTLSState gives srv's requests their r.TLS back: net/http sets it
// only when the connection is a *tls.Conn, and gateway.Listener wraps the
// TLS connection (to rewrite net/http's own error answers in plain
// bytes). The front proxy's client certificate is read from it.
func withTLSState(srv *http.Server) {
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		for {
			if tc, ok := c.(*tls.Conn); ok {
				return context.WithValue(ctx, tlsConnKey{}, tc)
			}
			u, ok := c.(interface{ NetConn() net.Conn })
			if !ok {
				return ctx
			}
			c = u.NetConn()
		}
	}
	next := srv.Handler
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tc, ok := r.Context().Value(tlsConnKey{}).(*tls.Conn); ok && r.TLS == nil {
			// The request has been read: the handshake is done.
			st := tc.ConnectionState()
			r.TLS = &st
		}
		next.ServeHTTP(w, r)
	})
}
