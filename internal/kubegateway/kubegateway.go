// Package kubegateway is `stoke gateway`, Kubernetes mode's front door for
// invocations, exec sessions and Run logs. It serves the routes of
// standalone's gateway from the same code (internal/gateway) over HTTPS;
// what differs is behind that package's small interfaces: callers are
// authenticated and authorized by the API server (TokenReview and
// SubjectAccessReview, cached briefly), Runs and runtime Pods are routed
// from informers in memory, and each call goes once to the owner Pod's
// runtimed over the mutual-TLS hop (internal/mtls), never retried after
// dispatch.
package kubegateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	certutil "k8s.io/client-go/util/cert"

	"stoke.dev/stoke/internal/gateway"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/metricsrpc"
	"stoke.dev/stoke/internal/mtls"
	"stoke.dev/stoke/internal/runtime/server"
	"stoke.dev/stoke/internal/runtimeset"
	"stoke.dev/stoke/internal/store/kube"
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
	// self-signed one is made at start (the API server's service proxy,
	// through which the CLI comes, does not verify it).
	CertFile, KeyFile string
	// HopTLSDir holds the gateway's client certificate for runtimed's
	// hop (the Secret stoke-gateway-tls: ca.crt, tls.crt, tls.key).
	HopTLSDir string
	// HopPort is runtimed's port (default DefaultHopPort).
	HopPort int
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
	Logger        *slog.Logger
	// OnListen, when set, is told the bound address.
	OnListen func(net.Addr)
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
	serving, reloadCert, err := servingConfig(cfg.CertFile, cfg.KeyFile, log)
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

	runs := informer.New(st.Runs(), informer.Options{Logger: log})
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

	auth := NewAuthorizer(AuthConfig{Client: client, TTL: cfg.AuthTTL, Clock: cfg.AuthClock, Audiences: cfg.TokenAudiences, Logger: log})
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
	// front of this gateway's queue (docs/http-api.md).
	fns := gateway.NewFunctions(gateway.FunctionsConfig{Hop: rt.hop, Synced: runs.HasSynced})
	runs.AddEventHandler(fns.Handler())
	g := gateway.New(gateway.Config{
		Router: rt, Exec: rt, Functions: fns, Logs: rt, Auth: auth, Metrics: metrics, Logger: log, Timeouts: cfg.Timeouts,
		Ready: func(context.Context) error {
			if !runs.HasSynced() || !pods.HasSynced() {
				return errors.New("the Run and Pod informers have not synced yet")
			}
			return nil
		},
	})
	raw, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	// The JSON answers to malformed requests sit above TLS, where the
	// bytes are plain.
	lis := gateway.Listener(tls.NewListener(raw, serving))
	if cfg.OnListen != nil {
		cfg.OnListen(raw.Addr())
	}
	srv := g.Server()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srv.BaseContext = func(net.Listener) context.Context { return ctx } // streams end when the server stops

	errc := make(chan error, 3)
	go func() { errc <- runs.Run(ctx) }()
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
	log.Info("gateway serving", "addr", raw.Addr().String(), "hop_port", cfg.HopPort)

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
	for range 2 {
		<-errc
	}
	if errors.Is(first, context.Canceled) {
		first = nil
	}
	return first
}

// podScrapeTimeout bounds the scrape of one runtime Pod's metrics.
const podScrapeTimeout = 2 * time.Second

// servingConfig is the HTTPS side: the files' certificate, reloaded when
// they change (the returned servingCert's Run watches them), or a
// self-signed one (no servingCert).
func servingConfig(certFile, keyFile string, log *slog.Logger) (*tls.Config, *servingCert, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
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
