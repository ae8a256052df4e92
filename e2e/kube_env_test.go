package e2e

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/deploy"
	"stoke.dev/stoke/internal/kubetest"
	"stoke.dev/stoke/internal/kubetest/nodeagent"
)

// Names a user's installation from the Helm chart (deploy/helm/stoke) has.
const (
	stokeNamespace = "stoke-system"     // the controller's namespace
	controllerName = "stoke-controller" // its Deployment and leader-election Lease
	gatewaySecret  = "stoke-gateway-tls"
	runsNamespace  = "default" // where examples/ and deploy/examples put Runs and Runtimes
	kubeNodes      = 2
)

// Bounds on waiting in the Kubernetes tests: generous, for a loaded
// 2-core machine running the whole cluster.
const (
	installBound = 3 * time.Minute // from applying deploy/ to a leader and Ready runtime Pods
	runBound     = 2 * time.Minute // from creating a Run to its end or Ready
)

// kubeEnv is Stoke in Kubernetes mode as a user installs it: a real
// kube-apiserver, etcd, kube-controller-manager and kube-scheduler
// (kubetest), node agents standing in for kubelets that run the Pods
// bound to them (image stoke → the stoke binary this test built), and
// deploy/ applied with kubectl: the CRDs, the controller's namespace,
// RBAC and Deployment (two replicas, run by the node agents like any
// Pod), and the example Runtimes.
type kubeEnv struct {
	// hostDir is a directory of the host outside /tmp (the controller's
	// Pods mount an emptyDir there) for the directories tests share with
	// the Pods' processes.
	hostDir string
	cluster *kubetest.Cluster
	kube    kubernetes.Interface
	stoke   rest.Interface // stoke.dev/v1alpha1
	agents  []*nodeagent.Agent
	roots   []string // the agents' RootDirs, for their Pods' logs
}

// startKube starts the cluster and installs Stoke into it; everything
// stops when t ends. If t failed, the end of every container's log is
// printed.
func startKube(t testing.TB) *kubeEnv { return startKubeWith(t, kubeInstall{docker: true}) }

// kubeInstall is what an install differs in from the chart's defaults.
type kubeInstall struct {
	// docker turns the gateway's Docker port on (gateway.docker.enabled,
	// kube_docker_test.go). Off, as by default, the gateways keep only the
	// Ready Runs in memory (docs/kubernetes.md), which BenchmarkKube
	// measures.
	docker bool
}

// startKubeWith is startKube with the install's differences.
func startKubeWith(t testing.TB, in kubeInstall) *kubeEnv {
	t.Helper()
	began := time.Now()
	e := startCluster(t)
	c := e.cluster
	e.hostDir = hostDir(t)
	images := userImages(t, filepath.Join(e.hostDir, "user-image"))
	for i := 1; i <= kubeNodes; i++ {
		root := t.TempDir()
		logf, err := os.OpenFile(filepath.Join(root, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		a, err := nodeagent.Start(context.Background(), nodeagent.Config{
			RESTConfig: c.Config, NodeName: fmt.Sprintf("stoke-node-%d", i), Stoke: stokeBin,
			InitBinary: containerInitBin, RootDir: root, Images: images,
			Logger: slog.New(slog.NewTextHandler(logf, &slog.HandlerOptions{Level: slog.LevelInfo})),
		})
		if err != nil {
			logf.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Stop(); logf.Close() })
		e.agents, e.roots = append(e.agents, a), append(e.roots, root)
	}
	// Runs before the agents stop: their Pods' logs are still there.
	t.Cleanup(func() {
		if t.Failed() {
			e.dumpLogs(t)
		}
	})

	// What `helm install stoke deploy/helm/stoke -n stoke-system
	// --create-namespace` installs, rendered by Helm's own packages: the
	// controller's objects first, the Runtimes once a replica leads.
	// The workflow artifact store (kube_workflow_test.go).
	controllerObjs, runtimeObjs := e.renderChart(t, startKubeS3(t), in.docker)
	e.applyFile(t, controllerObjs)
	e.awaitLeader(t, installBound)
	e.applyFile(t, runtimeObjs)
	e.awaitRuntimesReady(t, installBound)
	t.Logf("stoke installed in %v", time.Since(began).Round(time.Millisecond))
	return e
}

// startCluster starts the cluster startKube installs Stoke into, and
// nothing else, with the admin's clients; it stops when t ends.
func startCluster(t testing.TB) *kubeEnv {
	t.Helper()
	// -kube-pprof profiles the API server too.
	c := kubetest.Start(t, kubetest.Options{ControllerManager: true, Scheduler: true, Profiling: *kubePprof != ""})
	e := &kubeEnv{cluster: c}
	var err error
	if e.kube, err = kubernetes.NewForConfig(c.Config); err != nil {
		t.Fatal(err)
	}
	if e.stoke, err = stokeClient(c.Config); err != nil {
		t.Fatal(err)
	}
	return e
}

// hostDir makes a directory for t outside /tmp, removed when t ends.
func hostDir(t testing.TB) string {
	t.Helper()
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	parent := filepath.Join(cache, "stoke", "e2e")
	if err := os.MkdirAll(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(parent, "kube-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// sharedDir makes a directory in the host directory that every Pod's
// processes can write, whatever user they run as.
func (e *kubeEnv) sharedDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp(e.hostDir, "shared-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	return dir
}

// repoPath is path (slash-separated, from the repository root) from e2e/.
func repoPath(path string) string { return filepath.Join("..", filepath.FromSlash(path)) }

// renderChart writes the chart's objects (deploy.Render, default values
// but the Namespace, a generated gateway certificate and, with docker, the
// gateway's Docker port, the artifact store at s3URL and its credentials' Secret,
// into stokeNamespace) to two files: the Runtimes', and
// everything else's.
func (e *kubeEnv) renderChart(t testing.TB, s3URL string, docker bool) (others, runtimes string) {
	t.Helper()
	// The gateway's serving certificate from the chart's CA, which the
	// APIService then verifies it with.
	ms, err := deploy.Render(stokeNamespace, map[string]any{"namespace": map[string]any{"create": true},
		// With docker, the Docker port too (kube_docker_test.go), its
		// certificate for 127.0.0.1, where the test forwards a port to it.
		"gateway": map[string]any{"tls": map[string]any{"generate": true, "ipAddresses": []any{"127.0.0.1"}},
			"docker": map[string]any{"enabled": docker}},
		"artifacts": kubeS3Values(s3URL)})
	if err != nil {
		t.Fatal(err)
	}
	var o, r []string
	for _, m := range ms {
		switch filepath.Base(m.Template) {
		case "runtimes.yaml":
			r = append(r, m.Content)
		case "namespace.yaml":
			// The artifact store's credentials before the Pods that read
			// them, in the namespace the chart makes.
			o = append(o, m.Content, kubeS3SecretYAML())
		default:
			o = append(o, m.Content)
		}
	}
	if len(o) == 0 || len(r) == 0 {
		t.Fatalf("the chart rendered %d objects and %d Runtimes", len(o), len(r))
	}
	dir := t.TempDir()
	others, runtimes = filepath.Join(dir, "stoke.yaml"), filepath.Join(dir, "runtimes.yaml")
	for f, docs := range map[string][]string{others: o, runtimes: r} {
		if err := os.WriteFile(f, []byte(strings.Join(docs, "\n---\n")), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return others, runtimes
}

// applyFile is `kubectl apply -f file`.
func (e *kubeEnv) applyFile(t testing.TB, file string) string {
	t.Helper()
	return e.cluster.Kubectl(t, "apply", "-f", file)
}

// stokeClient is a REST client of stoke.dev/v1alpha1 with the admin's
// credentials.
func stokeClient(cfg *rest.Config) (rest.Interface, error) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &v1alpha1.SchemeGroupVersion
	c.APIPath = "/apis"
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	c.QPS, c.Burst = 500, 1000 // the tests' own load must not wait on client-side throttling
	return rest.RESTClientFor(c)
}

// createRun creates run in its namespace (runsNamespace when empty).
func (e *kubeEnv) createRun(ctx context.Context, run *v1alpha1.Run) (*v1alpha1.Run, error) {
	if run.Namespace == "" {
		run.Namespace = runsNamespace
	}
	out := &v1alpha1.Run{}
	err := e.stoke.Post().Namespace(run.Namespace).Resource("runs").Body(run).Do(ctx).Into(out)
	if err != nil {
		return nil, fmt.Errorf("create run %s: %w", run.Name, err)
	}
	return out, nil
}

// mustCreateRun is createRun failing t.
func (e *kubeEnv) mustCreateRun(t testing.TB, run *v1alpha1.Run) *v1alpha1.Run {
	t.Helper()
	out, err := e.createRun(context.Background(), run)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// deleteRun deletes a Run of runsNamespace and does not wait.
func (e *kubeEnv) deleteRun(t testing.TB, name string) {
	t.Helper()
	if err := e.stoke.Delete().Namespace(runsNamespace).Resource("runs").Name(name).Do(context.Background()).Error(); err != nil {
		t.Fatalf("delete run %s: %v", name, err)
	}
}

// objects follows one kind of object with an informer (a list, then a
// watch that relists by itself after an outage) and lets a test await a
// condition on all of them.
type objects[T runtime.Object] struct {
	mu      sync.Mutex
	byName  map[string]T
	history []seen[T]     // every add and update, in the order seen
	changed chan struct{} // closed and replaced at every change
	stop    context.CancelFunc
	done    chan struct{}
}

// follow starts following the objects of lw; it stops when t ends.
func follow[T runtime.Object](t testing.TB, lw cache.ListerWatcher, example T) *objects[T] {
	t.Helper()
	o := &objects[T]{byName: map[string]T{}, changed: make(chan struct{}), done: make(chan struct{})}
	set := func(obj any) {
		v, ok := obj.(T)
		if !ok {
			return
		}
		m, err := objectMeta(v)
		if err != nil {
			return
		}
		o.mu.Lock()
		o.byName[m.GetName()] = v
		o.history = append(o.history, seen[T]{at: time.Now(), obj: v})
		o.notify()
		o.mu.Unlock()
	}
	_, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw, ObjectType: example,
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    set,
			UpdateFunc: func(_, obj any) { set(obj) },
			DeleteFunc: func(obj any) {
				if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
					obj = d.Obj
				}
				if m, err := objectMeta(obj); err == nil {
					o.mu.Lock()
					delete(o.byName, m.GetName())
					o.notify()
					o.mu.Unlock()
				}
			},
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	o.stop = cancel
	go func() { defer close(o.done); ctrl.RunWithContext(ctx) }()
	t.Cleanup(o.close)
	return o
}

// seen is an object as the informer delivered it, and when.
type seen[T any] struct {
	at  time.Time
	obj T
}

// firstSeen is when an object that match accepts was first seen.
func (o *objects[T]) firstSeen(match func(T) bool) (time.Time, bool) {
	_, at, ok := o.first(match)
	return at, ok
}

// first is the first object that match accepts, and when it was seen.
func (o *objects[T]) first(match func(T) bool) (obj T, at time.Time, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, s := range o.history {
		if match(s.obj) {
			return s.obj, s.at, true
		}
	}
	return obj, time.Time{}, false
}

func objectMeta(obj any) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no object metadata", obj)
	}
	return m, nil
}

// notify wakes the waiters; o.mu is held.
func (o *objects[T]) notify() {
	close(o.changed)
	o.changed = make(chan struct{})
}

func (o *objects[T]) close() {
	o.stop()
	<-o.done
}

// until waits at most bound for cond to hold on the objects (by name) and
// returns them; it fails t with what when the bound passes.
func (o *objects[T]) until(t testing.TB, bound time.Duration, what string, cond func(map[string]T) bool) map[string]T {
	t.Helper()
	got, err := o.await(bound, cond)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return got
}

// await is until returning an error, for goroutines.
func (o *objects[T]) await(bound time.Duration, cond func(map[string]T) bool) (map[string]T, error) {
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		o.mu.Lock()
		ok := cond(o.byName)
		snapshot := make(map[string]T, len(o.byName))
		for k, v := range o.byName {
			snapshot[k] = v
		}
		changed := o.changed
		o.mu.Unlock()
		if ok {
			return snapshot, nil
		}
		select {
		case <-changed:
		case <-timer.C:
			return snapshot, fmt.Errorf("not within %v (%d objects)", bound, len(snapshot))
		}
	}
}

// watchRuns follows the Runs of runsNamespace whose labels match selector
// ("" for all).
func (e *kubeEnv) watchRuns(t testing.TB, selector string) *objects[*v1alpha1.Run] {
	t.Helper()
	lw := cache.NewFilteredListWatchFromClient(e.stoke, "runs", runsNamespace, func(o *metav1.ListOptions) { o.LabelSelector = selector })
	return follow(t, lw, &v1alpha1.Run{})
}

// watchRuntimes follows the Runtimes of runsNamespace.
func (e *kubeEnv) watchRuntimes(t testing.TB) *objects[*v1alpha1.Runtime] {
	t.Helper()
	return follow(t, cache.NewListWatchFromClient(e.stoke, "runtimes", runsNamespace, fields.Everything()), &v1alpha1.Runtime{})
}

// watchPods follows the Pods of namespace whose labels match selector.
func (e *kubeEnv) watchPods(t testing.TB, namespace, selector string) *objects[*corev1.Pod] {
	t.Helper()
	lw := cache.NewFilteredListWatchFromClient(e.kube.CoreV1().RESTClient(), "pods", namespace, func(o *metav1.ListOptions) { o.LabelSelector = selector })
	return follow(t, lw, &corev1.Pod{})
}

// watchLeases follows the Leases of namespace.
func (e *kubeEnv) watchLeases(t testing.TB, namespace string) *objects[*coordinationv1.Lease] {
	t.Helper()
	return follow(t, cache.NewListWatchFromClient(e.kube.CoordinationV1().RESTClient(), "leases", namespace, fields.Everything()), &coordinationv1.Lease{})
}

// awaitLeader waits for a controller replica to hold the leader Lease and
// returns its holder identity.
func (e *kubeEnv) awaitLeader(t testing.TB, bound time.Duration) string {
	t.Helper()
	leases := e.watchLeases(t, stokeNamespace)
	defer leases.close()
	got := leases.until(t, bound, "a controller leader", func(m map[string]*coordinationv1.Lease) bool {
		l := m[controllerName]
		return l != nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != ""
	})
	return *got[controllerName].Spec.HolderIdentity
}

// awaitRuntimesReady waits until every Runtime has as many ready Pods as
// it asks for.
func (e *kubeEnv) awaitRuntimesReady(t testing.TB, bound time.Duration) map[string]*v1alpha1.Runtime {
	t.Helper()
	rts := e.watchRuntimes(t)
	defer rts.close()
	return rts.until(t, bound, "every Runtime ready", func(m map[string]*v1alpha1.Runtime) bool {
		if len(m) == 0 {
			return false
		}
		for _, rt := range m {
			if rt.Status.ReadyPods < rt.Spec.Replicas {
				return false
			}
		}
		return true
	})
}

// podReady is when the Pod's Ready condition became True, if it is.
func podReady(p *corev1.Pod) (time.Time, bool) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return c.LastTransitionTime.Time, true
		}
	}
	return time.Time{}, false
}

// pod reads a Pod.
func (e *kubeEnv) pod(t testing.TB, namespace, name string) *corev1.Pod {
	t.Helper()
	p, err := e.kube.CoreV1().Pods(namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// dumpLogs prints the cluster's Pods, ReplicaSets and Events, and the end
// of every container log and agent log.
func (e *kubeEnv) dumpLogs(t testing.TB) {
	t.Helper()
	kubectl := exec.Command(filepath.Join(e.cluster.BinDir, "kubectl"), "--kubeconfig", e.cluster.Kubeconfig,
		"get", "pods,replicasets,leases,events", "-A", "-o", "wide")
	out, err := kubectl.CombinedOutput()
	t.Logf("kubectl get pods,replicasets,leases,events -A (%v):\n%s", err, out)
	for _, root := range e.roots {
		_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".log") {
				return nil
			}
			t.Logf("%s:\n%s", strings.TrimPrefix(path, root), tail(path, 40))
			return nil
		})
	}
}

// tail is the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
