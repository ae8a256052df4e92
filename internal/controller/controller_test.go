package controller_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/controller"
	"stoke.dev/stoke/internal/kubepods/kubepodstest"
	"stoke.dev/stoke/internal/kubetest"
	"stoke.dev/stoke/internal/probe"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/kube"
	"stoke.dev/stoke/internal/testtls"
)

// waitTimeout bounds every wait; nothing sleeps.
const waitTimeout = time.Minute

// ns is the controllers' namespace; Runtimes and Runs live in default.
const ns = "stoke-system"

// replica is one in-process controller.
type replica struct {
	c      *controller.Controller
	socket string
	cancel context.CancelFunc
	done   chan struct{}
	err    error // Run's result, once done is closed
	// scheduled receives the name of each Run this replica's scheduler
	// assigned (its OnScheduled hook, called once the write returns).
	scheduled chan string
	// watches counts the replica's watches of Runs.
	watches runWatches
}

// runWatches counts the watches of Runs a replica has open, and the most
// it ever had open at once.
type runWatches struct {
	mu         sync.Mutex
	open, most int
}

func (w *runWatches) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if err != nil || req.URL.Query().Get("watch") != "true" || !strings.HasSuffix(req.URL.Path, "/runs") {
			return resp, err
		}
		w.mu.Lock()
		w.open++
		w.most = max(w.most, w.open)
		w.mu.Unlock()
		resp.Body = &watchBody{ReadCloser: resp.Body, w: w}
		return resp, nil
	})
}

func (w *runWatches) mostOpen() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.most
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// watchBody is a watch's response body; closing it ends the watch.
type watchBody struct {
	io.ReadCloser
	w    *runWatches
	once sync.Once
}

func (b *watchBody) Close() error {
	b.once.Do(func() {
		b.w.mu.Lock()
		b.w.open--
		b.w.mu.Unlock()
	})
	return b.ReadCloser.Close()
}

// awaitScheduledBy waits until r's scheduler reports name.
func (r *replica) awaitScheduledBy(t *testing.T, name string) {
	t.Helper()
	select {
	case got := <-r.scheduled:
		if got != name {
			t.Fatalf("the replica scheduled %s, want %s", got, name)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("the replica did not report scheduling %s", name)
	}
}

// scheduledNothing fails t if r's scheduler reported any assignment.
func (r *replica) scheduledNothing(t *testing.T) {
	t.Helper()
	select {
	case got := <-r.scheduled:
		t.Errorf("the standby scheduled %s", got)
	default:
	}
}

// start runs a replica with short leader-election timings (lenient enough
// for a loaded machine under -race). It keeps its
// Lease when stopped, as a killed process would, so a standby takes over
// only once the Lease has expired.
func start(t *testing.T, cluster *kubetest.Cluster, certDir string) *replica {
	t.Helper()
	r := &replica{socket: filepath.Join(t.TempDir(), "run", "probe.sock"), done: make(chan struct{}), scheduled: make(chan string, 16)}
	rc := rest.CopyConfig(cluster.Config)
	rc.Wrap(r.watches.wrap)
	c, err := controller.New(controller.Config{
		REST: rc, Namespace: ns, MetricsAddr: "127.0.0.1:0", MetricsCertDir: certDir, ProbeSocket: r.socket,
		LeaseDuration: 8 * time.Second, RenewDeadline: 6 * time.Second, RetryPeriod: time.Second,
		KeepLeaseOnStop: true,
		OnScheduled:     func(run *v1alpha1.Run, _ time.Duration) { r.scheduled <- run.Name },
	})
	if err != nil {
		t.Fatal(err)
	}
	r.c = c
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		defer close(r.done)
		r.err = c.Run(ctx)
	}()
	t.Cleanup(r.stop)
	return r
}

// stop ends the replica as a crash would (its Lease stays held) and waits
// for Run to return.
func (r *replica) stop() {
	r.cancel()
	<-r.done
}

// elected returns the replica that leads first, and the other.
func elected(t *testing.T, a, b *replica) (leader, standby *replica) {
	t.Helper()
	select {
	case <-a.c.Elected():
		return a, b
	case <-b.c.Elected():
		return b, a
	case <-time.After(waitTimeout):
		t.Fatal("no replica was elected")
		return nil, nil
	}
}

// controllerLease returns the stoke-controller Lease.
func controllerLease(t *testing.T, kc kubernetes.Interface) *coordinationv1.Lease {
	t.Helper()
	lease, err := kc.CoordinationV1().Leases(ns).Get(t.Context(), controller.LeaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return lease
}

// awaitNewHolder watches the Lease from lease's version until another
// holder has it, and returns that holder.
func awaitNewHolder(t *testing.T, kc kubernetes.Interface, lease *coordinationv1.Lease) string {
	t.Helper()
	old := *lease.Spec.HolderIdentity
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	w, err := kc.CoordinationV1().Leases(ns).Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", controller.LeaseName).String(),
		ResourceVersion: lease.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		l, ok := ev.Object.(*coordinationv1.Lease)
		if ev.Type == watch.Error || !ok {
			t.Fatalf("lease watch: %v", ev.Object)
		}
		if h := l.Spec.HolderIdentity; h != nil && *h != "" && *h != old {
			return *h
		}
	}
	t.Fatalf("the Lease stayed with %s", old)
	return ""
}

// createRun creates a task Run of bash and returns it as stored.
func createRun(t *testing.T, st store.Store, name string) *v1alpha1.Run {
	t.Helper()
	run, err := st.Runs().Create(t.Context(), &v1alpha1.Run{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"true"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	return run
}

// awaitScheduled watches run until it is Scheduled and returns the pod UID
// it was assigned to.
func awaitScheduled(t *testing.T, st store.Store, run *v1alpha1.Run) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	w, err := st.Runs().Watch(ctx, store.WatchOptions{Namespace: run.Namespace, ResourceVersion: run.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.Events() {
		if ev.Type == store.Error {
			t.Fatalf("run watch: %v", ev.Err)
		}
		if r := ev.Object; r != nil && r.Name == run.Name && r.Status.Phase == v1alpha1.PhaseScheduled {
			return r.Status.AssignedPodUID
		}
	}
	t.Fatalf("run %s was not scheduled", run.Name)
	return ""
}

// awaitFreeSlots waits until the default bash Runtime's status says free.
func awaitFreeSlots(t *testing.T, st store.Store, free int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	rt, err := st.Runtimes().Get(ctx, "default", "bash")
	if err != nil {
		t.Fatal(err)
	}
	if rt.Status.FreeSlots == free && rt.Status.ReadyPods == 1 {
		return
	}
	w, err := st.Runtimes().Watch(ctx, store.WatchOptions{Namespace: "default", ResourceVersion: rt.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.Events() {
		if ev.Type == store.Error {
			t.Fatalf("runtime watch: %v", ev.Err)
		}
		if r := ev.Object; r != nil && r.Name == "bash" && r.Status.FreeSlots == free && r.Status.ReadyPods == 1 {
			return
		}
	}
	t.Fatalf("runtime default/bash never had %d free slots", free)
}

// Two replicas: one leads and schedules, the other waits; when the leader
// dies without releasing its Lease, the standby takes the Lease once it
// expires and schedules from then on. The Runs go to a fake Pod that is
// Ready and whose Lease the test renews as its runtimed would.
func TestLeaderElectionAndScheduling(t *testing.T) {
	cluster := kubetest.Start(t, kubetest.Options{})
	kc, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kc.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	st, err := kube.New(cluster.Config, kube.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Runtimes().Create(t.Context(), &v1alpha1.Runtime{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "bash"},
		Spec: v1alpha1.RuntimeSpec{Server: "bash", Replicas: 1, Runs: 4}}); err != nil {
		t.Fatal(err)
	}
	pod := kubepodstest.Create(t, kc, "default", "bash", "bash-fake")
	pod.SetReady(t, true, "127.0.0.2")
	renewing, stopRenewing := context.WithCancel(t.Context())
	renewed := pod.KeepRenewed(renewing, t, time.Second, 10)
	defer func() { stopRenewing(); <-renewed }()

	certDir, roots := metricsCert(t)
	a, b := start(t, cluster, certDir), start(t, cluster, certDir)
	leader, standby := elected(t, a, b)
	if err := probe.Check(t.Context(), leader.socket, controller.ServiceLeader); err != nil {
		t.Errorf("the leader's probe: %v", err)
	}
	if err := probe.Check(t.Context(), standby.socket, ""); err != nil {
		t.Errorf("the standby's probe: %v", err)
	}
	if err := probe.Check(t.Context(), standby.socket, controller.ServiceLeader); err == nil {
		t.Error("the standby says it leads")
	}

	first := createRun(t, st, "first")
	if uid := awaitScheduled(t, st, first); uid != string(pod.UID) {
		t.Fatalf("first was assigned to %s, want the fake pod %s", uid, pod.UID)
	}
	leader.awaitScheduledBy(t, "first")

	// The Runtime's status counts the Run's slot (the runtime-status
	// reconciler has read it), and the leader watched Runs once: the
	// reconciler counts from the scheduler's informer, not from a watch of
	// its own.
	awaitFreeSlots(t, st, 3)
	if n := leader.watches.mostOpen(); n != 1 {
		t.Errorf("the leader had %d watches of Runs open at once, want 1 (the scheduler's informer, shared with the Runtime status)", n)
	}

	t.Run("metrics need a Kubernetes identity allowed to get /metrics", func(t *testing.T) {
		checkMetricsAuth(t, kc, leader.c.MetricsAddr(), roots)
	})

	standby.scheduledNothing(t) // while it was the standby
	lease := controllerLease(t, kc)
	leader.stop()
	if leader.err != nil {
		t.Errorf("the stopped leader's Run: %v", leader.err)
	}
	awaitNewHolder(t, kc, lease)
	select {
	case <-standby.c.Elected():
	case <-time.After(waitTimeout):
		t.Fatal("the standby holds the Lease but was not elected")
	}
	second := createRun(t, st, "second")
	if uid := awaitScheduled(t, st, second); uid != string(pod.UID) {
		t.Fatalf("second was assigned to %s, want the fake pod %s", uid, pod.UID)
	}
	standby.awaitScheduledBy(t, "second")
	leader.scheduledNothing(t)

	// A leader that loses its Lease (here another holder takes it) stops
	// at once and Run fails, so that its process exits non-zero.
	lease = controllerLease(t, kc)
	now := metav1.NowMicro()
	lease.Spec.HolderIdentity, lease.Spec.RenewTime, lease.Spec.LeaseDurationSeconds = ptr.To("thief"), &now, ptr.To[int32](3600)
	if _, err := kc.CoordinationV1().Leases(ns).Update(t.Context(), lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-standby.done:
	case <-time.After(waitTimeout):
		t.Fatal("the leader whose Lease was taken still runs")
	}
	if standby.err == nil || !strings.Contains(standby.err.Error(), "leader election lost") {
		t.Fatalf("Run after the Lease was taken: %v", standby.err)
	}
}

// metricsCert writes a serving certificate for 127.0.0.1 as tls.crt and
// tls.key in a directory, and returns it with a pool that trusts it.
func metricsCert(t *testing.T) (string, *x509.CertPool) {
	t.Helper()
	certFile, keyFile, roots := testtls.SelfSigned(t)
	dir := t.TempDir()
	for src, dst := range map[string]string{certFile: "tls.crt", keyFile: "tls.key"} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, dst), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir, roots
}

// checkMetricsAuth scrapes /metrics with no token and with a malformed one
// (401), with the token of a ServiceAccount without RBAC (403), and with
// one bound to a ClusterRole that may get /metrics (200).
func checkMetricsAuth(t *testing.T, kc kubernetes.Interface, addr string, roots *x509.CertPool) {
	if addr == "" {
		t.Fatal("the metrics server has no address")
	}
	ctx := t.Context()
	for _, sa := range []string{"scraper", "nobody"} {
		if _, err := kc.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kc.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "stoke-metrics-reader"},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "stoke-metrics-reader"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "stoke-metrics-reader"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "scraper"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token := func(sa string) string {
		tr, err := kc.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}, Timeout: waitTimeout}
	defer client.CloseIdleConnections()
	scrape := func(token string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/metrics", nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(body)
	}
	if code, _ := scrape(""); code != http.StatusUnauthorized {
		t.Errorf("no token: %d, want 401", code)
	}
	// A TokenReview answers a malformed token with an error, which
	// controller-runtime's own filter turns into 500.
	if code, _ := scrape("not-a-token"); code != http.StatusUnauthorized {
		t.Errorf("a malformed token: %d, want 401", code)
	}
	if code, _ := scrape(token("nobody")); code != http.StatusForbidden {
		t.Errorf("a ServiceAccount without RBAC: %d, want 403", code)
	}
	code, body := scrape(token("scraper"))
	if code != http.StatusOK || !strings.Contains(body, "leader_election_master_status") {
		t.Errorf("an authorised scrape: %d, %.200q", code, body)
	}
	// The scheduler's metrics (controlplane.Metrics, one set per process):
	// the assignment made so far, nothing waiting.
	for _, want := range []string{"stoke_scheduling_duration_seconds_count ", "stoke_scheduler_waiting_runs 0\n",
		"stoke_scheduler_unschedulable_total ", "stoke_scheduler_conflicts_total "} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(body, "stoke_scheduling_duration_seconds_count 0\n") {
		t.Error("/metrics counts no assignment")
	}
}
