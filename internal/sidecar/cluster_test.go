package sidecar_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/kubetest"
	"stoke.dev/stoke/internal/mtls"
	"stoke.dev/stoke/internal/placement"
	"stoke.dev/stoke/internal/runtimed"
	"stoke.dev/stoke/internal/runtimeset"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/kube"
	"stoke.dev/stoke/internal/testbin"
	"stoke.dev/stoke/internal/testtls"
)

// stoke is the stoke binary, built once for the tests that run it.
var stoke struct {
	once    sync.Once
	path    string
	cleanup func()
	err     error
}

func stokeBinary(t *testing.T) string {
	t.Helper()
	stoke.once.Do(func() { stoke.path, stoke.cleanup, stoke.err = testbin.Stoke() })
	if stoke.err != nil {
		t.Fatal(stoke.err)
	}
	return stoke.path
}

func TestMain(m *testing.M) {
	code := m.Run()
	if stoke.cleanup != nil {
		stoke.cleanup()
	}
	os.Exit(code)
}

// podEnv is one runtime Pod without a kubelet: the Pod object in the API
// server (never scheduled), and its two containers as processes of this
// test — `stoke runtime-server` and `stoke runtimed` — sharing a private
// run directory and a workspace, runtimed with the credentials of a
// ServiceAccount bound to exactly the Role the reconciler gives runtimed.
type podEnv struct {
	c         *kubetest.Cluster
	cs        kubernetes.Interface
	runs      store.Resource[*v1alpha1.Run]
	cache     *runCache
	ns        string
	pod       *corev1.Pod
	dir       string
	run       string // the Pod's run directory (the emptyDir at /var/run/stoke)
	workspace string
	hop       string
	gateway   string // the gateway's credentials
}

func newPodEnv(t *testing.T, c *kubetest.Cluster) *podEnv {
	t.Helper()
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kube.New(c.Config, kube.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &podEnv{c: c, cs: cs, runs: st.Runs(), ns: c.Namespace(t), dir: t.TempDir()}
	e.run, e.workspace = filepath.Join(e.dir, "run"), filepath.Join(e.dir, "workspace")
	for _, d := range []string{e.run, e.workspace} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	e.cache = newRunCache(t, st.Runs(), e.ns)

	e.pod, err = cs.CoreV1().Pods(e.ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "bash-6d4cf-x7k2p", Labels: map[string]string{"stoke.dev/runtime": "bash"}},
		Spec: corev1.PodSpec{ServiceAccountName: "stoke-runtimed", Containers: []corev1.Container{
			{Name: "runtime-server", Image: "stoke"}, {Name: "runtimed", Image: "stoke"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := e.runtimedKubeconfig(t)

	ca := testtls.NewCA(t)
	tlsDir := ca.Issue(t, filepath.Join(e.dir, "runtimed-tls"), testtls.Leaf{CommonName: "runtimed", DNSNames: []string{mtls.RuntimedName}})
	e.gateway = ca.Issue(t, filepath.Join(e.dir, "gateway-tls"), testtls.Leaf{CommonName: mtls.GatewayName, Client: true})
	e.hop = net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))

	e.start(t, "runtimed", stokeBinary(t), "runtimed", "--kubeconfig", kubeconfig, "--listen", e.hop, "--tls-dir", tlsDir,
		"--runtime-server", e.runtimeServer(), "--workspace-root", e.workspace, "--probe-socket", e.probeSocket(), "--runtime", "bash")
	return e
}

func (e *podEnv) runtimeServer() string { return "unix://" + filepath.Join(e.run, "rs.sock") }

// startRuntimeServer starts the Pod's other container.
func (e *podEnv) startRuntimeServer(t *testing.T) {
	t.Helper()
	e.start(t, "runtime-server", stokeBinary(t), "runtime-server", "--runtime", "bash", "--listen", e.runtimeServer(),
		"--workspace-root", e.workspace, "--state-dir", filepath.Join(e.dir, "state"), "--containment", "subreaper")
}

func (e *podEnv) probeSocket() string { return filepath.Join(e.run, "runtimed.sock") }

// runtimedKubeconfig makes the ServiceAccount runtimed runs as, binds it
// to a Role of exactly the reconciler's runtimed rules in the Pod's namespace, and writes a
// kubeconfig with a token bound to the Pod.
func (e *podEnv) runtimedKubeconfig(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	const name = "stoke-runtimed"
	if _, err := e.cs.CoreV1().ServiceAccounts(e.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cs.RbacV1().Roles(e.ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: runtimeset.RuntimedRules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cs.RbacV1().RoleBindings(e.ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: e.ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := e.cs.CoreV1().ServiceAccounts(e.ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To(int64(3600)),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: e.pod.Name, UID: e.pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: e.c.Config.Host, CertificateAuthority: e.c.Config.CAFile, CertificateAuthorityData: e.c.Config.CAData}
	kc.AuthInfos["runtimed"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts["runtimed"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "runtimed", Namespace: e.ns}
	kc.CurrentContext = "runtimed"
	path := filepath.Join(e.dir, "runtimed.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// start runs one of the Pod's containers until the test ends, with the
// downward API's environment.
func (e *podEnv) start(t *testing.T, name, bin string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "POD_NAME="+e.pod.Name, "POD_NAMESPACE="+e.ns, "POD_UID="+string(e.pod.UID), "POD_IP=127.0.0.1")
	logFile, err := os.Create(filepath.Join(e.dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("%s did not stop within 20 s of SIGINT", name)
		}
		logFile.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logFile.Name()); err == nil {
				t.Logf("%s's log:\n%s", name, tail(b, 60))
			}
		}
	})
}

// probe runs `stoke runtimed probe`, the Pod's readiness probe.
func (e *podEnv) probe(t *testing.T) error {
	t.Helper()
	out, err := exec.Command(stokeBinary(t), "runtimed", "probe", "--socket", e.probeSocket()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// awaitReady polls the readiness probe, as the kubelet does.
func (e *podEnv) awaitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := e.probe(t)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("runtimed never became ready: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // a probe, like the kubelet's
	}
}

// submit creates a Run and assigns it to podUID (as the scheduler does).
func (e *podEnv) submit(t *testing.T, run *v1alpha1.Run, podName, podUID string) *v1alpha1.Run {
	t.Helper()
	ctx := context.Background()
	run.Namespace = e.ns
	created, err := e.runs.Create(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	created.Status.Phase, created.Status.Attempt = v1alpha1.PhaseScheduled, 1
	created.Status.AssignedPod, created.Status.AssignedPodUID = podName, podUID
	updated, err := e.runs.UpdateStatus(ctx, created)
	if err != nil {
		t.Fatal(err)
	}
	return updated
}

func TestRuntimedInCluster(t *testing.T) {
	c := kubetest.Start(t, kubetest.Options{})
	e := newPodEnv(t, c)
	ctx := context.Background()

	// Without its Runtime Server, runtimed answers its probe: not ready.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) { // a probe, like the kubelet's
		err := e.probe(t)
		if err != nil && strings.Contains(err.Error(), "has not synced") {
			break
		}
		if err == nil || time.Now().After(deadline) {
			t.Fatalf("runtimed without its runtime server: probe says %v", err)
		}
	}
	e.startRuntimeServer(t)
	e.awaitReady(t)

	// A Run of another Pod, assigned first: runtimed never touches it.
	other := e.submit(t, taskRun("other", `echo "RAN=yes" >> "$STOKE_OUTPUTS"`), "bash-6d4cf-other", "0b5e3a8c-other-pod-uid")

	// A task runs to Succeeded with its outputs, written by runtimed.
	task := e.submit(t, taskRun("task", `echo "GREETING=hello $1" >> "$STOKE_OUTPUTS"`), e.pod.Name, string(e.pod.UID))
	done := e.cache.await(t, "task", terminal)
	if done.Status.Phase != v1alpha1.PhaseSucceeded || done.Status.Outputs["GREETING"] != "hello world" ||
		done.Status.ExitCode == nil || *done.Status.ExitCode != 0 || done.UID != task.UID {
		t.Fatalf("task: %+v", done.Status)
	}

	// A function reaches Ready, and the gateway's invocation through the
	// hop answers.
	fn := e.submit(t, functionRun("fn"), e.pod.Name, string(e.pod.UID))
	if ready := e.cache.await(t, "fn", func(r *v1alpha1.Run) bool { return r.Status.Phase == v1alpha1.PhaseReady || terminal(r) }); ready.Status.Phase != v1alpha1.PhaseReady {
		t.Fatalf("function: %+v", ready.Status)
	}
	gw, err := mtls.ClientConfig(e.gateway)
	if err != nil {
		t.Fatal(err)
	}
	hop := (&hopEnv{addr: e.hop}).dial(t, gw)
	resp, err := invoke(hop, string(fn.UID))
	if err != nil || string(resp.GetOutput()) != `{"got":[1]}` {
		t.Fatalf("invoke through the hop: %v %v", resp, err)
	}

	// A function Run placed on this Pod at its create (a Function's
	// replica, placed by the scheduler before its create) is taken as
	// created: runtimed's write assigns, claims and marks it Ready at
	// once, with no write before it.
	pr := functionRun("placed")
	pr.Namespace, pr.Finalizers = e.ns, []string{runtimed.Finalizer}
	placement.Place(pr, string(e.pod.UID))
	created, err := e.runs.Create(ctx, pr)
	if err != nil {
		t.Fatal(err)
	}
	placedReady := e.cache.await(t, "placed", func(r *v1alpha1.Run) bool { return r.Status.Phase != "" })
	if st := placedReady.Status; st.Phase != v1alpha1.PhaseReady || st.AssignedPodUID != string(e.pod.UID) || st.Attempt != 1 {
		t.Fatalf("placed function: first status written %+v; want Ready on this Pod, attempt 1", st)
	}
	if created.UID != placedReady.UID {
		t.Fatalf("placed function: another Run")
	}

	// The other Pod's Run is as it was assigned: never claimed, written or
	// materialised here.
	got, err := e.runs.Get(ctx, e.ns, "other")
	if err != nil {
		t.Fatal(err)
	}
	if got.ResourceVersion != other.ResourceVersion || got.Status.Phase != v1alpha1.PhaseScheduled {
		t.Errorf("the other Pod's Run was touched: %+v", got.Status)
	}
	if _, err := os.Stat(filepath.Join(e.workspace, string(other.UID))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the other Pod's Run has a working directory here: %v", err)
	}

	// The Lease: named after the Pod, held by its UID, owned by it, and
	// renewed.
	lease := e.awaitLease(t, nil)
	if ptr.Deref(lease.Spec.HolderIdentity, "") != string(e.pod.UID) || ptr.Deref(lease.Spec.LeaseDurationSeconds, 0) != 10 ||
		len(lease.OwnerReferences) != 1 || lease.OwnerReferences[0].UID != e.pod.UID || lease.OwnerReferences[0].Kind != "Pod" {
		t.Errorf("lease: %+v %+v", lease.ObjectMeta, lease.Spec)
	}
	renewed := e.awaitLease(t, func(l *coordinationv1.Lease) bool { return !l.Spec.RenewTime.Equal(lease.Spec.RenewTime) })
	if !renewed.Spec.RenewTime.After(lease.Spec.RenewTime.Time) {
		t.Errorf("renewTime went from %v to %v", lease.Spec.RenewTime, renewed.Spec.RenewTime)
	}

	// The API server goes away while a task runs, and the task ends
	// meanwhile: its result is written once the API server is back.
	// The task waits for the go file, so that it ends while the API server
	// is down.
	gofile, marker := filepath.Join(e.dir, "slow-go"), filepath.Join(e.dir, "slow-done")
	e.submit(t, taskRun("slow", fmt.Sprintf(`while [ ! -e %q ]; do sleep 0.05; done; echo "LATE=$1" >> "$STOKE_OUTPUTS"; touch %q`, gofile, marker)),
		e.pod.Name, string(e.pod.UID))
	e.cache.await(t, "slow", func(r *v1alpha1.Run) bool { return r.Status.Phase == v1alpha1.PhaseRunning || terminal(r) })
	c.StopAPIServer(t)
	if err := os.WriteFile(gofile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) { // a file: no event to await
		if _, err := os.Stat(marker); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the slow task never finished")
		}
	}
	c.StartAPIServer(t)
	if slow := e.cache.await(t, "slow", terminal); slow.Status.Phase != v1alpha1.PhaseSucceeded || slow.Status.Outputs["LATE"] != "world" {
		t.Fatalf("slow task after the API server's restart: %+v", slow.Status)
	}
	e.awaitReady(t)
}

func terminal(r *v1alpha1.Run) bool { return r.Status.Phase.Terminal() }

// awaitLease watches the Pod's Lease until it exists and cond (nil: any)
// holds.
func (e *podEnv) awaitLease(t *testing.T, cond func(*coordinationv1.Lease) bool) *coordinationv1.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	leases := e.cs.CoordinationV1().Leases(e.ns)
	list, err := leases.List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", e.pod.Name).String()})
	if err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		if cond == nil || cond(&list.Items[i]) {
			return &list.Items[i]
		}
	}
	w, err := leases.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", e.pod.Name).String(), ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if l, ok := ev.Object.(*coordinationv1.Lease); ok && ev.Type != watch.Deleted && (cond == nil || cond(l)) {
			return l
		}
	}
	t.Fatalf("lease %s/%s: %v", e.ns, e.pod.Name, ctx.Err())
	return nil
}

// runCache is an informer of a namespace's Runs that a test awaits
// changes on.
type runCache struct {
	inf     *informer.Informer[*v1alpha1.Run]
	mu      sync.Mutex
	changed chan struct{}
}

func newRunCache(t *testing.T, runs store.Resource[*v1alpha1.Run], ns string) *runCache {
	t.Helper()
	rc := &runCache{inf: informer.New(runs, informer.Options{Namespace: ns}), changed: make(chan struct{})}
	signal := func(*v1alpha1.Run) {
		rc.mu.Lock()
		close(rc.changed)
		rc.changed = make(chan struct{})
		rc.mu.Unlock()
	}
	rc.inf.AddEventHandler(informer.HandlerFuncs[*v1alpha1.Run]{AddFunc: signal, UpdateFunc: func(_, r *v1alpha1.Run) { signal(r) }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = rc.inf.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return rc
}

// await returns the Run once cond holds for it.
func (rc *runCache) await(t *testing.T, name string, cond func(*v1alpha1.Run) bool) *v1alpha1.Run {
	t.Helper()
	timeout := time.NewTimer(90 * time.Second)
	defer timeout.Stop()
	for {
		rc.mu.Lock()
		changed := rc.changed
		rc.mu.Unlock()
		var ns string
		for _, r := range rc.inf.List(func(r *v1alpha1.Run) bool { return r.Name == name }) {
			ns = r.Namespace
			if cond(r) {
				return r
			}
		}
		select {
		case <-changed:
		case <-timeout.C:
			run, _ := rc.inf.Get(ns, name)
			t.Fatalf("run %s: the condition never held: %+v", name, run)
		}
	}
}

func taskRun(name, script string) *v1alpha1.Run {
	return &v1alpha1.Run{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.RunSpec{Runtime: "bash",
			Mode:   v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Entrypoint: "main.sh", Args: []string{"world"}}},
			Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "main.sh", Text: script}},
		},
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func tail(b []byte, lines int) []byte {
	n := 0
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == '\n' {
			n++
			if n > lines {
				return b[i+1:]
			}
		}
	}
	return b
}
