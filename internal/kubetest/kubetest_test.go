package kubetest_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/utils/ptr"

	"stoke.dev/stoke/internal/kubetest"
)

// TestCluster runs a cluster with both components: the controller-manager
// turns a Deployment into a ReplicaSet and a Pod, the real scheduler finds
// no node for the Pod, service-account tokens are issued and accepted, and
// clients work again after the API server is stopped and started. Once the
// cluster's test is over, none of its processes is left and its port is
// closed.
func TestCluster(t *testing.T) {
	var c *kubetest.Cluster
	t.Run("run", func(t *testing.T) {
		c = kubetest.Start(t, kubetest.Options{ControllerManager: true, Scheduler: true})
		cs, err := kubernetes.NewForConfig(c.Config)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		ns := metav1.NamespaceDefault
		labels := map[string]string{"app": "web"}
		dep := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "web"},
			Spec: appsv1.DeploymentSpec{
				Replicas: ptr.To[int32](1),
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "stoke"}}},
				},
			},
		}
		if dep, err = cs.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		until(ctx, t, "a ReplicaSet owned by the Deployment", cs.AppsV1().RESTClient(), "replicasets", ns, &appsv1.ReplicaSet{},
			func(rs *appsv1.ReplicaSet) bool {
				ref := metav1.GetControllerOf(rs)
				return ref != nil && ref.UID == dep.UID
			})
		pod := until(ctx, t, "an unschedulable Pod", cs.CoreV1().RESTClient(), "pods", ns, &corev1.Pod{},
			func(p *corev1.Pod) bool {
				for _, cond := range p.Status.Conditions {
					if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable {
						return true
					}
				}
				return false
			})
		if pod.Spec.ServiceAccountName != "default" {
			t.Errorf("Pod's serviceAccountName = %q; want the ServiceAccount admission plugin's default", pod.Spec.ServiceAccountName)
		}

		// A token bound to the Pod, as the node agent asks for one, is
		// accepted by the API server.
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "default", &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: &authenticationv1.BoundObjectReference{
				Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID,
			}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		review, err := cs.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
			Spec: authenticationv1.TokenReviewSpec{Token: tr.Status.Token},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if want := "system:serviceaccount:default:default"; !review.Status.Authenticated || review.Status.User.Username != want {
			t.Errorf("TokenReview of a Pod's token: %+v; want authenticated as %s", review.Status, want)
		}

		if got := c.Kubectl(t, "get", "deployment", "web", "-o", "jsonpath={.spec.replicas}"); got != "1" {
			t.Errorf("kubectl get deployment web: replicas %q; want 1", got)
		}
		// Starting the API server alone takes seconds of CPU.
		if cpu, err := c.CPU(); err != nil || cpu < 100*time.Millisecond {
			t.Errorf("the cluster's CPU time: %v, %v; want seconds", cpu, err)
		}

		c.StopAPIServer(t)
		if _, err := cs.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{}); err == nil {
			t.Fatal("Get worked with the API server stopped")
		}
		c.StartAPIServer(t)
		// The same client, and the controller-manager, work again.
		if _, err := cs.AppsV1().Deployments(ns).Patch(ctx, "web", "application/merge-patch+json",
			[]byte(`{"spec":{"replicas":2}}`), metav1.PatchOptions{}); err != nil {
			t.Fatalf("scale after the restart: %v", err)
		}
		until(ctx, t, "the Deployment's second Pod", cs.AppsV1().RESTClient(), "replicasets", ns, &appsv1.ReplicaSet{},
			func(rs *appsv1.ReplicaSet) bool { return rs.Status.Replicas == 2 })
	})
	if c == nil {
		return
	}
	for _, pid := range c.Pids() {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			t.Errorf("pid %d (%s) still exists after the test: %v", pid, strings.ReplaceAll(string(cmdline), "\x00", " "), err)
		}
	}
	host := strings.TrimPrefix(c.Config.Host, "https://")
	if conn, err := net.Dial("tcp", host); err == nil {
		conn.Close()
		t.Errorf("the API server's address %s still accepts connections after the test", host)
	}
}

func TestMain(m *testing.M) {
	kubetest.Main(m, kubetest.Options{ControllerManager: true})
}

// TestSharedNamespace uses the test binary's shared cluster: a namespace of
// the test's own admits Pods at once, with the default ServiceAccount's
// token projected into them.
func TestSharedNamespace(t *testing.T) {
	c := kubetest.Shared(t)
	if again := kubetest.Shared(t); again != c {
		t.Fatal("a second Shared call started another cluster")
	}
	ns := c.Namespace(t)
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := cs.CoreV1().Pods(ns).Create(t.Context(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "stoke"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create a Pod in a fresh namespace: %v", err)
	}
	projected := false
	for _, v := range pod.Spec.Volumes {
		if v.Projected != nil && slices.ContainsFunc(v.Projected.Sources, func(s corev1.VolumeProjection) bool { return s.ServiceAccountToken != nil }) {
			projected = true
		}
	}
	if pod.Spec.ServiceAccountName != "default" || !projected {
		t.Errorf("Pod: serviceAccountName %q, volumes %+v; want default's token projected", pod.Spec.ServiceAccountName, pod.Spec.Volumes)
	}
	if got := c.Kubectl(t, "get", "namespace", ns, "-o", "jsonpath={.status.phase}"); got != "Active" {
		t.Errorf("kubectl get namespace %s: phase %q; want Active", ns, got)
	}
}

// until watches the namespace's resource until cond holds for an object,
// and returns that object.
func until[T runtime.Object](ctx context.Context, t *testing.T, what string, rc cache.Getter, resource, ns string, obj T, cond func(T) bool) T {
	t.Helper()
	lw := cache.NewListWatchFromClient(rc, resource, ns, fields.Everything())
	ev, err := watchtools.UntilWithSync(ctx, lw, obj, nil, func(ev watch.Event) (bool, error) {
		o, ok := ev.Object.(T)
		return ok && ev.Type != watch.Deleted && cond(o), nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
	return ev.Object.(T)
}

// TestAggregationLayer registers an aggregated API served by this test
// (an HTTPS server on a loopback address, published as a Pod's IP) and
// calls it through the API server as the admin: the Pod's Service gets
// its EndpointSlice, the APIService becomes Available, and the request
// arrives with the admin's identity in X-Remote-* headers over a
// connection authenticated by a client certificate of the front-proxy CA
// that kube-system/extension-apiserver-authentication names.
func TestAggregationLayer(t *testing.T) {
	c := kubetest.Shared(t)
	ns := c.Namespace(t)
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("agg."+ns+".svc", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	type seen struct {
		user, groups string
		peers        []*x509.Certificate
	}
	calls := make(chan seen, 16)
	lis, err := tls.Listen("tcp", "127.0.250.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/apis/test.kubetest.stoke.dev/v1" && r.Header.Get("X-Remote-User") != "system:kube-aggregator" {
			select {
			case calls <- seen{r.Header.Get("X-Remote-User"), strings.Join(r.Header.Values("X-Remote-Group"), ","), r.TLS.PeerCertificates}:
			default:
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"test.kubetest.stoke.dev/v1","resources":[]}`))
	})}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { _ = srv.Close() })
	port := int32(lis.Addr().(*net.TCPAddr).Port)

	labels := map[string]string{"app": "agg"}
	pod, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "agg", Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "stoke",
			Ports: []corev1.ContainerPort{{Name: "https", ContainerPort: port}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// What the node agent would report of it.
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.250.1", PodIPs: []corev1.PodIP{{IP: "127.0.250.1"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "agg"},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromString("https")}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	until(ctx, t, "the Service's EndpointSlice", cs.DiscoveryV1().RESTClient(), "endpointslices", ns, &discoveryv1.EndpointSlice{},
		func(s *discoveryv1.EndpointSlice) bool {
			return s.Labels[discoveryv1.LabelServiceName] == "agg" && len(s.Endpoints) == 1 &&
				s.Endpoints[0].Addresses[0] == "127.0.250.1" && len(s.Ports) == 1 && *s.Ports[0].Port == port
		})

	apiService := fmt.Sprintf(`{"apiVersion":"apiregistration.k8s.io/v1","kind":"APIService","metadata":{"name":"v1.test.kubetest.stoke.dev"},
		"spec":{"group":"test.kubetest.stoke.dev","version":"v1","groupPriorityMinimum":100,"versionPriority":10,
		"service":{"namespace":%q,"name":"agg","port":443},"caBundle":%q}}`, ns, base64.StdEncoding.EncodeToString(certPEM))
	if err := cs.RESTClient().Post().AbsPath("/apis/apiregistration.k8s.io/v1/apiservices").Body([]byte(apiService)).
		SetHeader("Content-Type", "application/json").Do(ctx).Error(); err != nil {
		t.Fatal(err)
	}
	// An unavailable APIService would fail other tests' discovery.
	t.Cleanup(func() {
		_ = cs.RESTClient().Delete().AbsPath("/apis/apiregistration.k8s.io/v1/apiservices/v1.test.kubetest.stoke.dev").Do(context.Background()).Error()
	})
	// Polled: the availability check has no event a client can await
	// before it first passes.
	var body []byte
	for {
		body, err = cs.RESTClient().Get().AbsPath("/apis/test.kubetest.stoke.dev/v1").Do(ctx).Raw()
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("GET the aggregated API: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	if !strings.Contains(string(body), `"groupVersion":"test.kubetest.stoke.dev/v1"`) {
		t.Errorf("the aggregated API answered %s", body)
	}
	var got seen
	select {
	case got = <-calls:
	default:
		t.Fatal("the aggregated server saw no call from the admin")
	}
	if got.user != "kubetest-admin" || !strings.Contains(got.groups, "system:masters") {
		t.Errorf("X-Remote-User %q, X-Remote-Group %q; want the admin's", got.user, got.groups)
	}
	cm, err := cs.CoreV1().ConfigMaps("kube-system").Get(ctx, "extension-apiserver-authentication", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM([]byte(cm.Data["requestheader-client-ca-file"])) {
		t.Fatalf("the ConfigMap has no requestheader-client-ca-file: %v", cm.Data)
	}
	if len(got.peers) == 0 {
		t.Fatal("the API server sent no client certificate")
	}
	if _, err := got.peers[0].Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("the API server's client certificate: %v", err)
	}
	if cn := got.peers[0].Subject.CommonName; cn != kubetest.FrontProxyClientName || !strings.Contains(cm.Data["requestheader-allowed-names"], cn) {
		t.Errorf("client certificate CN %q, allowed names %s", cn, cm.Data["requestheader-allowed-names"])
	}
}
