package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/mtls"
	"stoke.dev/stoke/internal/testtls"
)

// hopPort is runtimed's invoke and exec hop on each runtime Pod's IP.
const hopPort = 7443

// gatewayCredentials writes the gateway's client credentials, from the
// Secret the controller keeps in its namespace, into a private directory
// laid out as the mounted Secret would be, and returns it.
func (e *kubeEnv) gatewayCredentials(t testing.TB) string {
	t.Helper()
	s, err := e.kube.CoreV1().Secrets(stokeNamespace).Get(context.Background(), gatewaySecret, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the gateway's credentials: %v", err)
	}
	dir := filepath.Join(t.TempDir(), "gateway-tls")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"ca.crt", "tls.crt", "tls.key"} {
		if len(s.Data[k]) == 0 {
			t.Fatalf("secret %s/%s has no %s", stokeNamespace, gatewaySecret, k)
		}
		if err := os.WriteFile(filepath.Join(dir, k), s.Data[k], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// hopAddr is the hop of the Pod a Run is assigned to.
func (e *kubeEnv) hopAddr(t testing.TB, run *v1alpha1.Run) string {
	t.Helper()
	if run.Status.AssignedPod == "" {
		t.Fatalf("run %s (%s) is assigned to no pod", run.Name, run.UID)
	}
	p := e.pod(t, run.Namespace, run.Status.AssignedPod)
	if string(p.UID) != run.Status.AssignedPodUID || p.Status.PodIP == "" {
		t.Fatalf("run %s: pod %s is %s with IP %q, the run's is %s", run.Name, p.Name, p.UID, p.Status.PodIP, run.Status.AssignedPodUID)
	}
	return net.JoinHostPort(p.Status.PodIP, strconv.Itoa(hopPort))
}

// dialHop connects to addr as a caller with cfg (nil: plaintext).
func dialHop(t testing.TB, addr string, cfg *tls.Config) *grpc.ClientConn {
	t.Helper()
	creds := insecure.NewCredentials()
	if cfg != nil {
		creds = credentials.NewTLS(cfg)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// gatewayConn is the gateway's connection to the hop of run's Pod.
func (e *kubeEnv) gatewayConn(t testing.TB, creds string, run *v1alpha1.Run) *grpc.ClientConn {
	t.Helper()
	cfg, err := mtls.ClientConfig(creds)
	if err != nil {
		t.Fatal(err)
	}
	return dialHop(t, e.hopAddr(t, run), cfg)
}

// invokeHop invokes a function by its Run UID through a hop connection.
func invokeHop(conn *grpc.ClientConn, run *v1alpha1.Run, input string) (*pb.InvokeFunctionResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := pb.NewFunctionRuntimeClient(conn).InvokeFunction(ctx, &pb.InvokeFunctionRequest{
		Registration: &pb.FunctionRegistration{RunUid: string(run.UID)},
		InvocationId: fmt.Sprintf("e2e-%d", time.Now().UnixNano()),
		Input:        []byte(input), ContentType: "application/json",
	})
	if err != nil {
		return nil, fmt.Errorf("invoke %s (%s): %w", run.Name, run.UID, err)
	}
	return resp, nil
}

// testHopRefusesStrangers: runtimed's port on the Pod IP answers the
// gateway's credential only. A caller without a client certificate, with
// one of another CA, or in plaintext never reaches the function.
func testHopRefusesStrangers(t *testing.T, e *kubeEnv) {
	runs := e.watchRuns(t, "e2e=hop")
	fn := e.mustCreateRun(t, labelled(newRun("guarded", function("bash", "fn.handle", "fn.sh",
		`handle() { printf '{"got":%s}' "$1"; }`)), "hop"))
	ready := runs.until(t, runBound, "guarded Ready", func(m map[string]*v1alpha1.Run) bool {
		return phaseOf(m, fn.Name) == v1alpha1.PhaseReady
	})[fn.Name]
	creds := e.gatewayCredentials(t)
	addr := e.hopAddr(t, ready)

	gateway := e.gatewayConn(t, creds, ready)
	resp, err := invokeHop(gateway, ready, `[1]`)
	if err != nil || string(resp.GetOutput()) != `{"got":[1]}` {
		t.Fatalf("the gateway's invocation: %v %v", resp, err)
	}
	lastActivity := func() int64 {
		t.Helper()
		st, err := pb.NewFunctionRuntimeClient(gateway).FunctionStatus(context.Background(),
			&pb.FunctionStatusRequest{Registration: &pb.FunctionRegistration{RunUid: string(ready.UID)}})
		if err != nil {
			t.Fatal(err)
		}
		return st.GetLastActivityUnixNano()
	}
	before := lastActivity()

	trustServer, err := mtls.ClientConfig(creds)
	if err != nil {
		t.Fatal(err)
	}
	refused := func(what string, cfg *tls.Config) {
		t.Helper()
		resp, err := invokeHop(dialHop(t, addr, cfg), ready, `[2]`)
		if status.Code(err) != codes.Unavailable {
			t.Errorf("%s: got %v %v, want the connection refused", what, resp, err)
		}
	}
	noCert := trustServer.Clone()
	noCert.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &tls.Certificate{}, nil }
	refused("no client certificate", noCert)

	otherCA := testtls.NewCA(t).Issue(t, filepath.Join(t.TempDir(), "other-ca"), testtls.Leaf{CommonName: mtls.GatewayName, Client: true})
	foreign, err := mtls.ClientConfig(otherCA)
	if err != nil {
		t.Fatal(err)
	}
	foreign.VerifyConnection = trustServer.VerifyConnection // it trusts the server; the server must not trust it
	refused("a client certificate named stoke-gateway of another CA", foreign)
	refused("plaintext", nil)
	if after := lastActivity(); after != before {
		t.Errorf("the function was active after the gateway's invocation (%d, then %d)", before, after)
	}

	e.deleteRun(t, fn.Name)
}
