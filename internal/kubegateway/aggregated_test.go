package kubegateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/client/cluster"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/gateway"
)

// oneRun stands in for the Runs and their runtime Pods behind the
// gateway's routes (runtimed's hop): the function team/fn (UID uid-1)
// echoes its input, exec runs commands in a directory of the test's, and
// its log is one record. It counts the calls that reach it.
type oneRun struct {
	pb.UnimplementedFunctionRuntimeServer
	exec    exec.Executor
	invokes atomic.Int64
	execs   atomic.Int64
}

func (o *oneRun) find(ns, name string) error {
	if ns != "team" || name != "fn" {
		return errdefs.Errorf(errdefs.ErrNotFound, "run %s/%s not found", ns, name)
	}
	return nil
}

func (o *oneRun) Route(ns, name, uid string) (pb.FunctionRuntimeServer, error) {
	if err := o.find(ns, name); err != nil || uid != "uid-1" {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "run %s/%s with uid %s not found", ns, name, uid)
	}
	return o, nil
}

func (o *oneRun) InvokeFunction(_ context.Context, req *pb.InvokeFunctionRequest) (*pb.InvokeFunctionResponse, error) {
	o.invokes.Add(1)
	return &pb.InvokeFunctionResponse{Output: req.GetInput(), ContentType: "application/json", InvocationId: req.GetInvocationId()}, nil
}

func (o *oneRun) ExecRoute(ns, name string) (exec.Executor, string, error) {
	if err := o.find(ns, name); err != nil {
		return nil, "", err
	}
	o.execs.Add(1)
	return o.exec, "uid-1", nil
}

func (o *oneRun) OpenLog(_ context.Context, ns, name string, _ bool) (gateway.LogStream, error) {
	if err := o.find(ns, name); err != nil {
		return nil, err
	}
	return &oneRecord{line: []byte(`{"stream":"stdout","line":"hello from fn"}` + "\n")}, nil
}

type oneRecord struct{ line []byte }

func (l *oneRecord) Next(context.Context) ([]byte, error) {
	if l.line == nil {
		return nil, io.EOF
	}
	b := l.line
	l.line = nil
	return b, nil
}
func (l *oneRecord) Close() error { return nil }

type dirTarget string

func (d dirTarget) ExecTarget(string, string) (exec.Target, error) {
	return exec.Target{Dir: string(d), Env: []string{"PATH=/usr/bin:/bin"}}, nil
}

// The gateway as the aggregated API gateway.stoke.dev/v1alpha1 on a real
// API server (its Pod, Service and APIService as the chart makes them,
// with deploy/'s stoke-edit and stoke-view): the CLI's cluster backend,
// with nothing but a kubeconfig token, invokes, execs (a WebSocket
// through the aggregator) and reads logs as a stoke-edit user; a
// stoke-view user reads logs and is refused invoke and exec by the API
// server; a user the API server lets through to the gateway without
// stoke.dev's runs/invoke is refused by the gateway's own
// SubjectAccessReview; an unknown token is 401 from the API server; and
// identity headers sent to the gateway directly — without a client
// certificate, or with one the front-proxy CA did not sign — are 401.
// Only the editor's calls reach the Run, and the gateway made no
// TokenReview for proxied callers.
func TestAggregatedAPIOnARealAPIServer(t *testing.T) {
	e := startAuthEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	proxy, err := newFrontProxy(e.client)
	if err != nil {
		t.Fatal(err)
	}
	if err := proxy.load(ctx); err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithCancel(context.Background())
	pdone := make(chan error, 1)
	go func() { pdone <- proxy.Run(pctx) }()
	t.Cleanup(func() { pcancel(); <-pdone })

	run := &oneRun{exec: exec.NewLocal(exec.LocalConfig{Targets: dirTarget(t.TempDir())})}
	g := gateway.New(gateway.Config{Router: run, Exec: run, Logs: run, Aggregated: true,
		Auth: NewAuthorizer(AuthConfig{Client: e.client, FrontProxy: proxy})})

	// The gateway's Service is stoke-gateway in the namespace team; its
	// serving certificate names it, as the chart's does.
	dir := t.TempDir()
	const podIP = "127.0.250.2"
	// The Pod's IP too, for a caller that names the gateway's URL
	// (--gateway) rather than going through the API server.
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("stoke-gateway."+e.ns+".svc", []net.IP{net.ParseIP(podIP)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	serving, _, err := servingConfig(certFile, keyFile, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.Listen("tcp", podIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	srv, lis := httpsServer(g, raw, serving)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { _ = srv.Close() })
	port := int32(raw.Addr().(*net.TCPAddr).Port)

	e.registerGateway(ctx, t, podIP, port, certPEM)

	editor := e.user(t, "editor", "stoke-edit")
	viewer := e.user(t, "viewer", "stoke-view")
	// Allowed through the API server, not by the gateway.
	if _, err := e.admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "gateway-group-only"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{gateway.AggregatedGroup}, Resources: []string{"runs/invoke", "runs/exec", "runs/log"}, Verbs: []string{"get", "create"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	outsider := e.user(t, "outsider", "gateway-group-only")

	cli := func(token string) *cluster.Client {
		c, err := cluster.New(cluster.Config{REST: &rest.Config{Host: e.cluster.Config.Host, BearerToken: token,
			TLSClientConfig: rest.TLSClientConfig{CAData: e.cluster.Config.CAData}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}

	// The editor: invoke, logs, exec.
	ed := cli(editor)
	res, err := ed.Invoke(ctx, e.ns, "fn", "uid-1", []byte(`{"n":1}`), client.InvokeOptions{InvocationID: "inv-1"})
	if err != nil || res.StatusCode != http.StatusOK || string(res.Body) != `{"n":1}` || res.InvocationID != "inv-1" {
		t.Fatalf("editor's invoke: %+v, %v", res, err)
	}
	logs, err := ed.Logs(ctx, e.ns, "fn", false)
	if err != nil {
		t.Fatalf("editor's logs: %v", err)
	}
	rec, err := logs.Next()
	_ = logs.Close()
	if err != nil || rec.Line != "hello from fn" {
		t.Errorf("editor's log record: %+v, %v", rec, err)
	}
	sess, err := ed.Exec().Start(ctx, exec.Request{RunUID: e.ns + "/fn", Command: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}})
	if err != nil {
		t.Fatalf("editor's exec: %v", err)
	}
	var stdout, stderr bytes.Buffer
	exit, err := sess.Stream(ctx, exec.Streams{Stdout: &stdout, Stderr: &stderr})
	_ = sess.Close()
	if err != nil || exit.Code != 3 || stdout.String() != "out\n" || stderr.String() != "err\n" {
		t.Errorf("editor's exec: exit %+v, %v, stdout %q, stderr %q", exit, err, stdout.String(), stderr.String())
	}
	if n := e.count.tokenReviews.Load(); n != 0 {
		t.Errorf("the gateway made %d TokenReviews for callers the API server authenticated", n)
	}
	if e.count.sars.Load() == 0 {
		t.Error("the gateway made no SubjectAccessReview of the proxied editor")
	}

	// The viewer reads logs; the API server refuses its invoke and exec.
	vw := cli(viewer)
	if l, err := vw.Logs(ctx, e.ns, "fn", false); err != nil {
		t.Errorf("viewer's logs: %v", err)
	} else {
		_ = l.Close()
	}
	_, err = vw.Invoke(ctx, e.ns, "fn", "uid-1", []byte(`{}`), client.InvokeOptions{})
	wantStatus(t, "viewer's invoke", err, http.StatusForbidden, "")
	_, err = vw.Exec().Start(ctx, exec.Request{RunUID: e.ns + "/fn", Command: []string{"true"}})
	wantStatus(t, "viewer's exec", err, http.StatusForbidden, "")

	// Let through by the API server, refused by the gateway's review on
	// stoke.dev (its JSON error, naming the resource).
	out := cli(outsider)
	_, err = out.Invoke(ctx, e.ns, "fn", "uid-1", []byte(`{}`), client.InvokeOptions{})
	wantStatus(t, "outsider's invoke", err, http.StatusForbidden, `"runs/invoke" in API group "stoke.dev"`)
	_, err = out.Exec().Start(ctx, exec.Request{RunUID: e.ns + "/fn", Command: []string{"true"}})
	wantStatus(t, "outsider's exec", err, http.StatusForbidden, `"runs/exec" in API group "stoke.dev"`)

	_, err = cli("not-a-token").Invoke(ctx, e.ns, "fn", "uid-1", []byte(`{}`), client.InvokeOptions{})
	wantStatus(t, "unknown token's invoke", err, http.StatusUnauthorized, "")

	// Straight to the gateway, claiming to be an admin in headers.
	forged := func(certs []tls.Certificate) int {
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: certs}}}
		defer hc.CloseIdleConnections()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost,
			fmt.Sprintf("https://%s:%d%s/namespaces/%s/runs/fn/invoke/uid-1", podIP, port, gateway.AggregatedPrefix, e.ns), strings.NewReader(`{}`))
		req.Header.Set("X-Remote-User", "system:admin")
		req.Header.Set("X-Remote-Group", "system:masters")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.StatusCode
	}
	if code := forged(nil); code != http.StatusUnauthorized {
		t.Errorf("forged headers without a client certificate: %d; want 401", code)
	}
	selfCert, selfKey, err := certutil.GenerateSelfSignedCertKey("front-proxy-client", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	self, err := tls.X509KeyPair(selfCert, selfKey)
	if err != nil {
		t.Fatal(err)
	}
	if code := forged([]tls.Certificate{self}); code != http.StatusUnauthorized {
		t.Errorf("forged headers with a self-signed front-proxy-client certificate: %d; want 401", code)
	}

	if n, x := run.invokes.Load(), run.execs.Load(); n != 1 || x != 1 {
		t.Errorf("%d invokes and %d execs reached the Run; want the editor's one each", n, x)
	}

	// --gateway URL with --ca-cert (cluster.Config.Gateway, CACertFile):
	// the editor's invoke, exec and log read go straight to the gateway
	// with the kubeconfig's token, which the gateway reviews itself; the
	// same URL without the CA is refused by TLS, before any call.
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	gwURL := fmt.Sprintf("https://%s:%d", podIP, port)
	direct := func(ca string) *cluster.Client {
		c, err := cluster.New(cluster.Config{REST: &rest.Config{Host: e.cluster.Config.Host, BearerToken: editor,
			TLSClientConfig: rest.TLSClientConfig{CAData: e.cluster.Config.CAData}}, Gateway: gwURL, CACertFile: ca})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	reviews := e.count.tokenReviews.Load()
	gw := direct(caFile)
	res, err = gw.Invoke(ctx, e.ns, "fn", "uid-1", []byte(`{"n":2}`), client.InvokeOptions{InvocationID: "inv-2"})
	if err != nil || res.StatusCode != http.StatusOK || string(res.Body) != `{"n":2}` || res.InvocationID != "inv-2" {
		t.Fatalf("the editor's invoke through --gateway: %+v, %v", res, err)
	}
	if logs, err = gw.Logs(ctx, e.ns, "fn", false); err != nil {
		t.Fatalf("the editor's logs through --gateway: %v", err)
	}
	rec, err = logs.Next()
	_ = logs.Close()
	if err != nil || rec.Line != "hello from fn" {
		t.Errorf("the editor's log record through --gateway: %+v, %v", rec, err)
	}
	if sess, err = gw.Exec().Start(ctx, exec.Request{RunUID: e.ns + "/fn", Command: []string{"sh", "-c", "echo direct"}}); err != nil {
		t.Fatalf("the editor's exec through --gateway: %v", err)
	}
	stdout.Reset()
	exit, err = sess.Stream(ctx, exec.Streams{Stdout: &stdout, Stderr: io.Discard})
	_ = sess.Close()
	if err != nil || exit.Code != 0 || stdout.String() != "direct\n" {
		t.Errorf("the editor's exec through --gateway: exit %+v, %v, stdout %q", exit, err, stdout.String())
	}
	if e.count.tokenReviews.Load() == reviews {
		t.Error("the gateway reviewed no token: the calls did not go to it directly")
	}
	if n, x := run.invokes.Load(), run.execs.Load(); n != 2 || x != 2 {
		t.Errorf("%d invokes and %d execs reached the Run; want 2 each", n, x)
	}
	if _, err := direct("").Invoke(ctx, e.ns, "fn", "uid-1", []byte(`{}`), client.InvokeOptions{}); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("--gateway without the gateway's CA: %v, want a certificate error", err)
	}
	if n := run.invokes.Load(); n != 2 {
		t.Errorf("the refused call reached the Run (%d invokes)", n)
	}
}

// wantStatus checks that err is the HTTP status code, and that its
// message says what (when given).
func wantStatus(t *testing.T, what string, err error, code int, says string) {
	t.Helper()
	var apiErr *client.APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != code || !strings.Contains(err.Error(), says) {
		t.Errorf("%s: %v; want HTTP %d saying %q", what, err, code, says)
	}
}

// registerGateway publishes the gateway listening on podIP:port as the
// chart does: a Pod (its status as a kubelet would report it), the
// Service stoke-gateway and the APIService v1alpha1.gateway.stoke.dev
// with the serving certificate's CA; and waits until the API server
// serves the group.
func (e *authEnv) registerGateway(ctx context.Context, t *testing.T, podIP string, port int32, caPEM []byte) {
	t.Helper()
	labels := map[string]string{"app.kubernetes.io/name": "stoke-gateway"}
	pod, err := e.admin.CoreV1().Pods(e.ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "stoke-gateway", Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "gateway", Image: "stoke",
			Ports: []corev1.ContainerPort{{Name: "https", ContainerPort: port}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: podIP, PodIPs: []corev1.PodIP{{IP: podIP}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if _, err := e.admin.CoreV1().Pods(e.ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.CoreV1().Services(e.ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "stoke-gateway"},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromString("https")}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	apiService := fmt.Sprintf(`{"apiVersion":"apiregistration.k8s.io/v1","kind":"APIService","metadata":{"name":"v1alpha1.gateway.stoke.dev"},
		"spec":{"group":"gateway.stoke.dev","version":"v1alpha1","groupPriorityMinimum":100,"versionPriority":10,
		"service":{"namespace":%q,"name":"stoke-gateway","port":443},"caBundle":%q}}`, e.ns, base64.StdEncoding.EncodeToString(caPEM))
	rc := e.admin.CoreV1().RESTClient()
	if err := rc.Post().AbsPath("/apis/apiregistration.k8s.io/v1/apiservices").Body([]byte(apiService)).
		SetHeader("Content-Type", "application/json").Do(ctx).Error(); err != nil {
		t.Fatal(err)
	}
	// Polled: the API server's availability check has no event a client
	// can await before it first passes.
	for {
		body, err := rc.Get().AbsPath(gateway.AggregatedPrefix).Do(ctx).Raw()
		if err == nil {
			if !strings.Contains(string(body), `"groupVersion":"gateway.stoke.dev/v1alpha1"`) {
				t.Fatalf("the aggregated API's discovery: %s", body)
			}
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the API server does not serve %s: %v", gateway.AggregatedPrefix, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
