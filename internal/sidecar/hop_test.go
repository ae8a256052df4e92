package sidecar_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/exec/exectest"
	"stoke.dev/stoke/internal/gateway"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/metricsrpc"
	"stoke.dev/stoke/internal/mtls"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/runtime/server"
	"stoke.dev/stoke/internal/runtimed"
	"stoke.dev/stoke/internal/sidecar"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/sqlite"
	"stoke.dev/stoke/internal/testtls"
)

// hopEnv is one pod without Kubernetes: a real Runtime Server on a Unix
// socket, a SQLite Run store, runtimed fed by an informer of the pod's
// Runs, and its hop served with mutual TLS on a loopback port.
type hopEnv struct {
	runs store.Resource[*v1alpha1.Run]
	pod  podsource.Pod
	addr string
	ca   *testtls.CA
	// gateway is the gateway's credentials directory.
	gateway string
	root    string
}

func newHopEnv(t *testing.T) *hopEnv {
	t.Helper()
	dir := t.TempDir()
	ws := filepath.Join(dir, "workspace")
	sock := filepath.Join(dir, "run", "rs.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	listening := make(chan net.Addr, 1)
	srvErr := make(chan error, 1)
	go func() {
		srvErr <- server.Run(ctx, server.Config{Runtime: "bash", Listen: "unix:" + sock, WorkspaceRoot: ws,
			StateDir: filepath.Join(dir, "state"), ShutdownGrace: time.Second, Logger: log,
			OnListen: func(a net.Addr) { listening <- a }})
	}()
	select {
	case <-listening:
	case err := <-srvErr:
		cancel()
		t.Fatal(err)
	}
	st, err := sqlite.Open(ctx, filepath.Join(dir, "db"))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+sock, server.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	pod := podsource.Pod{Namespace: "default", Runtime: "bash", Name: "bash-abcde", UID: "pod-uid-1", Server: "bash", Slots: 8,
		Addr: "unix://" + sock, WorkspaceRoot: ws}
	inf := informer.New(st.Runs(), informer.Options{Namespace: pod.Namespace, AssignedPodUID: pod.UID, Logger: log})
	metrics := runtimed.NewMetrics(func() []v1alpha1.Phase {
		var phases []v1alpha1.Phase
		for _, r := range inf.List(nil) {
			phases = append(phases, r.Status.Phase)
		}
		return phases
	})
	d := runtimed.Start(ctx, runtimed.Config{Pod: pod, Runs: st.Runs(), Conn: conn, Logger: log, StatusPoll: 50 * time.Millisecond, Metrics: metrics})
	inf.AddEventHandler(d.Handler())
	infDone := make(chan struct{})
	go func() {
		defer close(infDone)
		_ = inf.Run(ctx)
	}()

	e := &hopEnv{runs: st.Runs(), pod: pod, ca: testtls.NewCA(t), root: dir}
	srvDir := e.ca.Issue(t, filepath.Join(dir, "runtimed-tls"), testtls.Leaf{CommonName: "runtimed", DNSNames: []string{mtls.RuntimedName}})
	e.gateway = e.ca.Issue(t, filepath.Join(dir, "gateway-tls"), testtls.Leaf{CommonName: mtls.GatewayName, Client: true})
	tlsCfg, err := mtls.ServerConfig(srvDir)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = lis.Addr().String()
	hop := sidecar.NewHop(log, d.Daemon, tlsCfg, nil, metrics)
	hopErr := make(chan error, 1)
	go func() { hopErr <- hop.Serve(ctx, lis, time.Second, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-hopErr; err != nil {
			t.Errorf("hop: %v", err)
		}
		<-infDone
		d.Stop()
		conn.Close()
		st.Close()
		if err := <-srvErr; err != nil {
			t.Errorf("runtime server: %v", err)
		}
	})
	return e
}

// dial connects to the hop as a caller with cfg.
func (e *hopEnv) dial(t *testing.T, cfg *tls.Config) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// gatewayConn is the gateway's connection to the hop.
func (e *hopEnv) gatewayConn(t *testing.T) *grpc.ClientConn {
	t.Helper()
	cfg, err := mtls.ClientConfig(e.gateway)
	if err != nil {
		t.Fatal(err)
	}
	return e.dial(t, cfg)
}

// submit creates the Run assigned to the pod (as the scheduler would) and
// polls the store until it reaches one of phases.
func (e *hopEnv) submit(t *testing.T, run *v1alpha1.Run, phases ...v1alpha1.Phase) *v1alpha1.Run {
	t.Helper()
	ctx := context.Background()
	created, err := e.runs.Create(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	created.Status.Phase, created.Status.Attempt = v1alpha1.PhaseScheduled, 1
	created.Status.AssignedPod, created.Status.AssignedPodUID = e.pod.Name, e.pod.UID
	if _, err := e.runs.UpdateStatus(ctx, created); err != nil {
		t.Fatal(err)
	}
	return e.await(t, run.Name, phases...)
}

func (e *hopEnv) await(t *testing.T, name string, phases ...v1alpha1.Phase) *v1alpha1.Run {
	t.Helper()
	deadline := time.Now().Add(exectest.Timeout)
	for {
		run, err := e.runs.Get(context.Background(), "default", name)
		if err == nil {
			for _, p := range phases {
				if run.Status.Phase == p {
					return run
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s never reached %v: %+v %v", name, phases, run, err)
		}
		time.Sleep(10 * time.Millisecond) // polling the store, which has no event for a test to await
	}
}

func functionRun(name string) *v1alpha1.Run {
	return &v1alpha1.Run{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1alpha1.RunSpec{Runtime: "bash",
			Mode:   v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "fn.handle"}},
			Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "fn.sh", Text: `handle() { printf '{"got":%s}' "$1"; }`}},
		},
	}
}

func invoke(conn *grpc.ClientConn, uid string) (*pb.InvokeFunctionResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return pb.NewFunctionRuntimeClient(conn).InvokeFunction(ctx, &pb.InvokeFunctionRequest{
		Registration: &pb.FunctionRegistration{RunUid: uid}, Input: []byte(`[1]`)})
}

// The hop answers the gateway, and refuses, each on a real TLS
// connection, a caller without a client certificate, with one of another
// CA, and with one of its CA for another name: none of them reaches the
// function.
func TestHopServesOnlyTheGateway(t *testing.T) {
	e := newHopEnv(t)
	fn := e.submit(t, functionRun("fn"), v1alpha1.PhaseReady)
	uid := string(fn.UID)

	resp, err := invoke(e.gatewayConn(t), uid)
	if err != nil || string(resp.GetOutput()) != `{"got":[1]}` || resp.GetRegistration().GetRegistrationId() != "" {
		t.Fatalf("the gateway's invocation: %v %v", resp, err)
	}
	lastActivity := func() int64 {
		t.Helper()
		st, err := pb.NewFunctionRuntimeClient(e.gatewayConn(t)).FunctionStatus(context.Background(),
			&pb.FunctionStatusRequest{Registration: &pb.FunctionRegistration{RunUid: uid}})
		if err != nil {
			t.Fatal(err)
		}
		return st.GetLastActivityUnixNano()
	}
	before := lastActivity()
	// Errors cross the hop as status codes.
	if _, err := invoke(e.gatewayConn(t), "no-such-run"); status.Code(err) != codes.NotFound {
		t.Fatalf("an unknown run through the hop: %v", err)
	}

	trustServer, err := mtls.ClientConfig(e.gateway)
	if err != nil {
		t.Fatal(err)
	}
	refused := func(what string, cfg *tls.Config) {
		t.Helper()
		resp, err := invoke(e.dial(t, cfg), uid)
		if status.Code(err) != codes.Unavailable {
			t.Errorf("%s: got %v %v, want the connection refused", what, resp, err)
		}
	}

	noCert := trustServer.Clone()
	noCert.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &tls.Certificate{}, nil }
	refused("no client certificate", noCert)

	otherCA := testtls.NewCA(t).Issue(t, filepath.Join(e.root, "other-ca"), testtls.Leaf{CommonName: mtls.GatewayName, Client: true})
	foreign, err := mtls.ClientConfig(otherCA)
	if err != nil {
		t.Fatal(err)
	}
	foreign.VerifyConnection = trustServer.VerifyConnection // it trusts the server; the server must not trust it
	refused("a client certificate of another CA", foreign)

	wrongName := e.ca.Issue(t, filepath.Join(e.root, "wrong-name"), testtls.Leaf{CommonName: "stoke-intruder", Client: true})
	wrong, err := mtls.ClientConfig(wrongName)
	if err != nil {
		t.Fatal(err)
	}
	refused("a client certificate of the CA for another name", wrong)

	// Plaintext gets nowhere either.
	plain, err := grpc.NewClient(e.addr, server.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := invoke(plain, uid); status.Code(err) != codes.Unavailable {
		t.Errorf("plaintext: %v", err)
	}

	// None of them reached the function.
	if after := lastActivity(); after != before {
		t.Errorf("the function was active after the gateway's invocation (%d, then %d)", before, after)
	}
}

// runtimed's metrics are served on the hop (metrics.v1), to the gateway
// alone: its Runs by phase, the dispatch latency of the function's
// registration, and the hop's invocations by result.
func TestHopServesRuntimedMetrics(t *testing.T) {
	e := newHopEnv(t)
	fn := e.submit(t, functionRun("fn"), v1alpha1.PhaseReady)
	if _, err := invoke(e.gatewayConn(t), string(fn.UID)); err != nil {
		t.Fatal(err)
	}
	if _, err := invoke(e.gatewayConn(t), "no-such-run"); status.Code(err) != codes.NotFound {
		t.Fatalf("an unknown run: %v", err)
	}
	scrape := func() string {
		t.Helper()
		mfs, err := metricsrpc.Scrape(context.Background(), e.gatewayConn(t))
		if err != nil {
			t.Fatal(err)
		}
		var text strings.Builder
		for _, mf := range mfs {
			if _, err := expfmt.MetricFamilyToText(&text, mf); err != nil {
				t.Fatal(err)
			}
		}
		return text.String()
	}
	// The phases are the informer's, which may show Ready a moment after
	// the store.
	text := scrape()
	for deadline := time.Now().Add(exectest.Timeout); !strings.Contains(text, `stoke_runtimed_runs{phase="Ready"} 1`) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		text = scrape()
	}
	for _, want := range []string{
		`stoke_runtimed_runs{phase="Ready"} 1`, `stoke_runtimed_runs{phase="Running"} 0`,
		`stoke_runtimed_dispatch_duration_seconds_count{mode="function"} 1`,
		`stoke_runtimed_invocations_total{result="ok"} 1`, `stoke_runtimed_invocations_total{result="not_found"} 1`,
		`stoke_runtimed_invocation_duration_seconds_count{result="ok"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("runtimed's metrics lack %s:\n%s", want, text)
		}
	}
	// A client certificate of the CA for another name gets nothing.
	other, err := mtls.ClientConfig(e.ca.Issue(t, filepath.Join(e.root, "scraper"), testtls.Leaf{CommonName: "prometheus", Client: true}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := metricsrpc.Scrape(context.Background(), e.dial(t, other)); status.Code(err) != codes.Unavailable {
		t.Errorf("a scrape with another name's certificate: %v, want the connection refused", err)
	}
}

// A function still registering on its pod (here its source blocks on a
// FIFO the test holds) answers through the hop with FailedPrecondition and
// a Retry-After, which crosses gRPC (errdefs' RetryInfo) so that the
// gateway answers 503 with Retry-After, as standalone's does; once it is
// registered, the same call is answered.
func TestHopCarriesRetryAfterOfARegisteringFunction(t *testing.T) {
	e := newHopEnv(t)
	fifo := filepath.Join(t.TempDir(), "hold")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	run := functionRun("slow")
	run.Spec.Source.Inline.Text = fmt.Sprintf("handle() { printf '{\"got\":%%s}' \"$1\"; }\nread -r _ < %q\n", fifo)
	fn := e.submit(t, run, v1alpha1.PhaseRunning)
	uid := string(fn.UID)

	_, err := invoke(e.gatewayConn(t), uid)
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("invoking a registering function through the hop: %v, want FailedPrecondition", err)
	}
	if d, ok := errdefs.RetryAfter(errdefs.FromGRPC(err)); !ok || d != time.Second {
		t.Errorf("Retry-After through the hop: %v, %v; want 1s", d, ok)
	}
	// The gateway's answer, over this hop (as the Kubernetes gateway routes
	// a Run its informer shows Ready while runtimed registers it again).
	g := gateway.New(gateway.Config{Router: hopRouter{c: pb.NewFunctionRuntimeClient(e.gatewayConn(t))}, Token: "t"})
	srv := httptest.NewServer(g)
	defer srv.Close()
	post := func() *http.Response {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/namespaces/default/runs/slow/"+uid+"/invoke", strings.NewReader(`[1]`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer t")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp
	}
	if resp := post(); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("the gateway answered %d with Retry-After %q, want 503 with 1", resp.StatusCode, resp.Header.Get("Retry-After"))
	}

	f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("go\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	e.await(t, "slow", v1alpha1.PhaseReady)
	if resp := post(); resp.StatusCode != http.StatusOK {
		t.Errorf("the registered function answered %d", resp.StatusCode)
	}
}

// hopRouter routes every invocation to one hop, as the Kubernetes
// gateway's routes do (kubegateway.remoteFunctions).
type hopRouter struct{ c pb.FunctionRuntimeClient }

func (r hopRouter) Route(string, string, string) (pb.FunctionRuntimeServer, error) {
	return hopFunctions{c: r.c}, nil
}

type hopFunctions struct {
	pb.UnimplementedFunctionRuntimeServer
	c pb.FunctionRuntimeClient
}

func (f hopFunctions) InvokeFunction(ctx context.Context, req *pb.InvokeFunctionRequest) (*pb.InvokeFunctionResponse, error) {
	return f.c.InvokeFunction(ctx, req)
}

var execRuns atomic.Int64

// The exec suite through the hop over mutual TLS.
func TestHopExec(t *testing.T) {
	e := newHopEnv(t)
	conn := e.gatewayConn(t)
	exectest.Test(t, exectest.Harness{
		Executor: exec.NewGRPCClient(conn), Signals: true, RequestEnv: true, Pids: true,
		Task: func(t *testing.T) exectest.Run {
			t.Helper()
			name := fmt.Sprintf("exec-%d", execRuns.Add(1))
			run := e.submit(t, &v1alpha1.Run{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
				Spec: v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"sleep", "100000"}}},
					Env: []v1alpha1.EnvVar{{Name: "RUN_VAR", Value: "run-value"}}}}, v1alpha1.PhaseRunning)
			return exectest.Run{UID: string(run.UID), Dir: filepath.Join(e.pod.WorkspaceRoot, string(run.UID)),
				Env: map[string]string{"RUN_VAR": "run-value"},
				End: func(t *testing.T) {
					cur, err := e.runs.Get(context.Background(), "default", name)
					if err != nil {
						t.Errorf("end %s: %v", name, err)
						return
					}
					cur.Spec.CancelRequested = true
					if _, err := e.runs.Update(context.Background(), cur); err != nil {
						t.Errorf("cancel %s: %v", name, err)
						return
					}
					e.await(t, name, v1alpha1.PhaseCancelled)
				}}
		},
	})
}
