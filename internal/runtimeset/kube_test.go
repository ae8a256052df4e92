package runtimeset_test

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/kubetest"
	"stoke.dev/stoke/internal/mtls"
	"stoke.dev/stoke/internal/pki"
	"stoke.dev/stoke/internal/runtimeset"
	"stoke.dev/stoke/internal/store/kube"
	"stoke.dev/stoke/internal/testdeps"
)

func TestMain(m *testing.M) {
	ctrl.SetLogger(logr.Discard())
	kubetest.Main(m, kubetest.Options{ControllerManager: true, Scheduler: true})
}

// controllerNamespace is deploy/controller's namespace.
const controllerNamespace = "stoke-system"

func newScheme(t *testing.T) *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// deployFile is the path of a manifest under deploy/.
func deployFile(t *testing.T, name string) string {
	root, err := testdeps.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "deploy", name)
}

// exampleRuntimes is deploy/examples/runtimes.yaml placed in ns: the file,
// rendered from the chart, names the chart's Runtime namespace, which
// `kubectl apply -n` refuses to override.
func exampleRuntimes(t *testing.T, ns string) string {
	b, err := os.ReadFile(deployFile(t, "examples/runtimes.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	placed := strings.ReplaceAll(string(b), "\n  namespace: default\n", "\n  namespace: "+ns+"\n")
	if placed == string(b) {
		t.Fatal("deploy/examples/runtimes.yaml names no namespace default to replace")
	}
	path := filepath.Join(t.TempDir(), "runtimes.yaml")
	if err := os.WriteFile(path, []byte(placed), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// impersonate is c's admin configuration acting as user.
func impersonate(c *kubetest.Cluster, user string) *rest.Config {
	cfg := rest.CopyConfig(c.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	return cfg
}

// startController applies deploy/controller's namespace, ServiceAccount
// and RBAC as a user would, and runs the reconcilers as the controller's
// ServiceAccount, so that every call they make is held to its ClusterRole.
func startController(t *testing.T, c *kubetest.Cluster) {
	t.Helper()
	c.Kubectl(t, "apply", "-f", deployFile(t, "controller/00-namespace.yaml"), "-f", deployFile(t, "controller/serviceaccount.yaml"), "-f", deployFile(t, "controller/rbac.yaml"))
	cfg := impersonate(c, "system:serviceaccount:"+controllerNamespace+":stoke-controller")
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 newScheme(t),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Logger:                 logr.Discard(),
		// Each test runs its own manager, one after the other.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	// The Runs come from an informer over the store, as the leader's
	// scheduler's in stoke controller, with the controller's identity.
	st, err := kube.New(cfg, kube.Options{})
	if err != nil {
		t.Fatal(err)
	}
	runs := informer.New(st.Runs(), informer.Options{})
	feed := runtimeset.NewRunFeed()
	feed.Attach(runs.List, runs.Synced())
	removeFeed := runs.AddEventHandler(feed)
	if err := runtimeset.Setup(mgr, runtimeset.Options{Namespace: controllerNamespace, Image: "stoke", StatusInterval: 200 * time.Millisecond, Runs: feed}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- mgr.Start(ctx) }()
	go func() { done <- runs.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("manager: %v", err)
			}
		}
		removeFeed()
		st.Close()
	})
}

// until waits, with a deadline, for cond to hold over the objects of list's
// kind in namespace ns, checking at the start and on every change.
func until(t *testing.T, cl client.WithWatch, ns string, list client.ObjectList, obj client.Object, what string, cond func(items []client.Object) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			l := list.DeepCopyObject().(client.ObjectList)
			return l, cl.List(ctx, l, client.InNamespace(ns), &client.ListOptions{Raw: &o})
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			l := list.DeepCopyObject().(client.ObjectList)
			return cl.Watch(ctx, l, client.InNamespace(ns), &client.ListOptions{Raw: &o})
		},
	}
	var store cache.Store
	check := func() bool {
		var items []client.Object
		for _, o := range store.List() {
			items = append(items, o.(client.Object))
		}
		return cond(items)
	}
	_, err := watchtools.UntilWithSync(ctx, lw, obj, func(s cache.Store) (bool, error) {
		store = s
		return check(), nil
	}, func(watch.Event) (bool, error) { return check(), nil })
	if err != nil {
		t.Fatalf("waiting for %s in %s: %v", what, ns, err)
	}
}

func owned(o client.Object, owner client.Object) bool {
	return slices.ContainsFunc(o.GetOwnerReferences(), func(r metav1.OwnerReference) bool { return r.UID == owner.GetUID() })
}

// TestRuntimeBecomesPodsAndGoesWithThem applies the example Runtimes: each
// becomes a Deployment of the reconciler's template, the real
// controller-manager makes its ReplicaSet and Pods, the namespace gets
// runtimed's ServiceAccount, Role, RoleBinding and TLS Secret, and the
// status lists the Pods. Deleting a Runtime lets the real garbage
// collector remove its Deployment, ReplicaSet and Pods; the namespace's
// objects go with the last Runtime.
func TestRuntimeBecomesPodsAndGoesWithThem(t *testing.T) {
	c := kubetest.Shared(t)
	startController(t, c)
	cl, err := client.NewWithWatch(c.Config, client.Options{Scheme: newScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	ns := c.Namespace(t)
	c.Kubectl(t, "apply", "-n", ns, "-f", exampleRuntimes(t, ns))

	var rt v1alpha1.Runtime
	if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: "bash"}, &rt); err != nil {
		t.Fatal(err)
	}
	want := runtimeset.Deployment(&rt, runtimeset.Options{Image: "stoke"})
	var dep *appsv1.Deployment
	until(t, cl, ns, &appsv1.DeploymentList{}, &appsv1.Deployment{}, "the bash Runtime's Deployment", func(items []client.Object) bool {
		for _, o := range items {
			if d := o.(*appsv1.Deployment); d.Name == "bash" {
				dep = d
				return true
			}
		}
		return false
	})
	if !metav1.IsControlledBy(dep, &rt) {
		t.Errorf("deployment owners %+v, want controlled by the Runtime", dep.OwnerReferences)
	}
	if dep.Annotations[runtimeset.AnnotationTemplateHash] != want.Annotations[runtimeset.AnnotationTemplateHash] || *dep.Spec.Replicas != 2 {
		t.Errorf("deployment hash %q replicas %d, want %q and 2", dep.Annotations[runtimeset.AnnotationTemplateHash], *dep.Spec.Replicas, want.Annotations[runtimeset.AnnotationTemplateHash])
	}
	var names []string
	for _, ctr := range dep.Spec.Template.Spec.Containers {
		names = append(names, ctr.Name+":"+strings.Join(ctr.Args[:1], ""))
	}
	if got := strings.Join(names, ","); got != "runtime-server:runtime-server,runtimed:runtimed" {
		t.Errorf("containers %s", got)
	}

	var rs *appsv1.ReplicaSet
	until(t, cl, ns, &appsv1.ReplicaSetList{}, &appsv1.ReplicaSet{}, "the Deployment's ReplicaSet", func(items []client.Object) bool {
		for _, o := range items {
			if owned(o, dep) {
				rs = o.(*appsv1.ReplicaSet)
				return true
			}
		}
		return false
	})
	bashPods := func(items []client.Object) (n int) {
		for _, o := range items {
			if owned(o, rs) && o.GetLabels()[runtimeset.LabelRuntime] == "bash" {
				n++
			}
		}
		return n
	}
	until(t, cl, ns, &corev1.PodList{}, &corev1.Pod{}, "two bash Pods of the ReplicaSet", func(items []client.Object) bool { return bashPods(items) == 2 })

	// The namespace's objects, owned by both Runtimes.
	var python v1alpha1.Runtime
	if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: "python"}, &python); err != nil {
		t.Fatal(err)
	}
	nsObjects := []client.Object{&corev1.ServiceAccount{}, &rbacv1.Role{}, &rbacv1.RoleBinding{}}
	for _, o := range nsObjects {
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: runtimeset.ServiceAccount}, o); err != nil {
			t.Fatalf("%T: %v", o, err)
		}
		if !owned(o, &rt) || !owned(o, &python) {
			t.Errorf("%T %s owners %+v, want both Runtimes", o, o.GetName(), o.GetOwnerReferences())
		}
	}
	verifySecrets(t, cl, ns)

	// The status lists both Pods (none ready: no node runs them here).
	until(t, cl, ns, &v1alpha1.RuntimeList{}, &v1alpha1.Runtime{}, "the bash Runtime's status", func(items []client.Object) bool {
		for _, o := range items {
			if r := o.(*v1alpha1.Runtime); r.Name == "bash" {
				return len(r.Status.Pods) == 2 && r.Status.ReadyPods == 0 && r.Status.FreeSlots == 0
			}
		}
		return false
	})

	// A spec change rolls the Deployment.
	c.Kubectl(t, "patch", "-n", ns, "runtime", "bash", "--type=merge", "-p", `{"spec":{"replicas":3}}`)
	until(t, cl, ns, &appsv1.DeploymentList{}, &appsv1.Deployment{}, "three replicas", func(items []client.Object) bool {
		for _, o := range items {
			if d := o.(*appsv1.Deployment); d.Name == "bash" {
				return *d.Spec.Replicas == 3
			}
		}
		return false
	})

	// So does a template change: the Pods get the template's env.
	c.Kubectl(t, "patch", "-n", ns, "runtime", "bash", "--type=merge", "-p", `{"spec":{"template":{"env":[{"name":"GREETING","value":"hi"}]}}}`)
	until(t, cl, ns, &appsv1.DeploymentList{}, &appsv1.Deployment{}, "the template's env in the Pods", func(items []client.Object) bool {
		for _, o := range items {
			if d := o.(*appsv1.Deployment); d.Name == "bash" {
				rs := d.Spec.Template.Spec.Containers[0]
				return slices.ContainsFunc(rs.Env, func(e corev1.EnvVar) bool { return e.Name == "GREETING" && e.Value == "hi" }) &&
					slices.Contains(rs.Args, "GREETING")
			}
		}
		return false
	})

	c.Kubectl(t, "delete", "-n", ns, "runtime", "bash", "--wait=false")
	until(t, cl, ns, &appsv1.DeploymentList{}, &appsv1.Deployment{}, "the bash Deployment gone", func(items []client.Object) bool {
		return !slices.ContainsFunc(items, func(o client.Object) bool { return o.GetName() == "bash" })
	})
	until(t, cl, ns, &appsv1.ReplicaSetList{}, &appsv1.ReplicaSet{}, "the bash ReplicaSet gone", func(items []client.Object) bool {
		return !slices.ContainsFunc(items, func(o client.Object) bool { return o.GetUID() == rs.UID })
	})
	until(t, cl, ns, &corev1.PodList{}, &corev1.Pod{}, "the bash Pods gone", func(items []client.Object) bool { return bashPods(items) == 0 })
	// python still owns the namespace's objects.
	for _, o := range append(nsObjects, &corev1.Secret{}) {
		name := runtimeset.ServiceAccount
		if _, ok := o.(*corev1.Secret); ok {
			name = pki.RuntimedSecret
		}
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, o); err != nil {
			t.Fatalf("%T %s after deleting one of two Runtimes: %v", o, name, err)
		}
	}
	c.Kubectl(t, "delete", "-n", ns, "runtime", "python", "--wait=false")
	until(t, cl, ns, &corev1.SecretList{}, &corev1.Secret{}, "runtimed's TLS Secret gone with the last Runtime", func(items []client.Object) bool {
		return !slices.ContainsFunc(items, func(o client.Object) bool { return o.GetName() == pki.RuntimedSecret })
	})
	until(t, cl, ns, &rbacv1.RoleList{}, &rbacv1.Role{}, "runtimed's Role gone with the last Runtime", func(items []client.Object) bool { return len(items) == 0 })
}

// verifySecrets checks that runtimed's server certificate in ns and the
// gateway's client certificate chain to the CA in stoke-ca, for the names
// each side checks.
func verifySecrets(t *testing.T, cl client.Client, ns string) {
	t.Helper()
	ctx := t.Context()
	get := func(ns, name string) *corev1.Secret {
		var s corev1.Secret
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
			t.Fatalf("secret %s/%s: %v", ns, name, err)
		}
		if s.Type != corev1.SecretTypeTLS {
			t.Errorf("secret %s/%s has type %s", ns, name, s.Type)
		}
		return &s
	}
	ca := get(controllerNamespace, pki.CASecret)
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca.Data[pki.KeyCert]) {
		t.Fatal("stoke-ca holds no certificate")
	}
	leaf := func(s *corev1.Secret) *x509.Certificate {
		block, _ := pem.Decode(s.Data[pki.KeyCert])
		if block == nil {
			t.Fatalf("secret %s holds no certificate", s.Name)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if string(s.Data[pki.KeyCA]) != string(ca.Data[pki.KeyCA]) {
			t.Errorf("secret %s/%s: ca.crt is not the CA's trust bundle", s.Namespace, s.Name)
		}
		return cert
	}
	srv := leaf(get(ns, pki.RuntimedSecret))
	if _, err := srv.Verify(x509.VerifyOptions{Roots: roots, DNSName: mtls.RuntimedName, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("runtimed's certificate: %v", err)
	}
	cli := leaf(get(controllerNamespace, pki.GatewaySecret))
	if _, err := cli.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil || cli.Subject.CommonName != mtls.GatewayName {
		t.Errorf("the gateway's certificate: CN %q: %v", cli.Subject.CommonName, err)
	}
}

// TestRuntimedRole acts as runtimed's ServiceAccount: it may write the
// status of a Run in its namespace and its Lease, and may not list Runs in
// another namespace, read Secrets, or delete Runs.
func TestRuntimedRole(t *testing.T) {
	c := kubetest.Shared(t)
	startController(t, c)
	admin, err := client.New(c.Config, client.Options{Scheme: newScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	ns, other := c.Namespace(t), c.Namespace(t)
	c.Kubectl(t, "apply", "-n", ns, "-f", exampleRuntimes(t, ns))
	// The reconciler made the RoleBinding and the TLS Secret (the last
	// thing it makes of a namespace's) once this exists.
	cl, err := client.NewWithWatch(c.Config, client.Options{Scheme: newScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	until(t, cl, ns, &corev1.SecretList{}, &corev1.Secret{}, "runtimed's TLS Secret", func(items []client.Object) bool {
		return slices.ContainsFunc(items, func(o client.Object) bool { return o.GetName() == pki.RuntimedSecret })
	})
	run := &v1alpha1.Run{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "t"},
		Spec:       v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"true"}}}},
	}
	if err := admin.Create(ctx, run); err != nil {
		t.Fatal(err)
	}
	otherRun := run.DeepCopy()
	otherRun.Namespace, otherRun.ResourceVersion, otherRun.UID = other, "", ""
	if err := admin.Create(ctx, otherRun); err != nil {
		t.Fatal(err)
	}

	rd, err := client.New(impersonate(c, fmt.Sprintf("system:serviceaccount:%s:%s", ns, runtimeset.ServiceAccount)), client.Options{Scheme: newScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	var mine v1alpha1.Run
	if err := rd.Get(ctx, client.ObjectKeyFromObject(run), &mine); err != nil {
		t.Fatalf("runtimed cannot read a Run of its namespace: %v", err)
	}
	mine.Status.Phase = v1alpha1.PhaseRunning
	mine.Status.Attempt = 1
	if err := rd.Status().Update(ctx, &mine); err != nil {
		t.Fatalf("runtimed cannot write a Run's status in its namespace: %v", err)
	}
	var runs v1alpha1.RunList
	if err := rd.List(ctx, &runs, client.InNamespace(ns)); err != nil {
		t.Fatalf("runtimed cannot list the Runs of its namespace: %v", err)
	}
	forbidden := map[string]error{
		"list Runs in another namespace": rd.List(ctx, &v1alpha1.RunList{}, client.InNamespace(other)),
		"list Runs in every namespace":   rd.List(ctx, &v1alpha1.RunList{}),
		"write a Run's status in another namespace": func() error {
			r := otherRun.DeepCopy()
			r.Status.Phase = v1alpha1.PhaseRunning
			return rd.Status().Update(ctx, r)
		}(),
		"read its own TLS Secret":   rd.Get(ctx, client.ObjectKey{Namespace: ns, Name: pki.RuntimedSecret}, &corev1.Secret{}),
		"read the CA":               rd.Get(ctx, client.ObjectKey{Namespace: controllerNamespace, Name: pki.CASecret}, &corev1.Secret{}),
		"list Secrets":              rd.List(ctx, &corev1.SecretList{}, client.InNamespace(ns)),
		"delete a Run":              rd.Delete(ctx, mine.DeepCopy()),
		"create a Run":              rd.Create(ctx, &v1alpha1.Run{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "x"}, Spec: run.Spec}),
		"list Pods":                 rd.List(ctx, &corev1.PodList{}, client.InNamespace(ns)),
		"write a Runtime's status":  rd.Status().Update(ctx, &v1alpha1.Runtime{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bash"}}),
		"delete its Role":           rd.Delete(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: runtimeset.ServiceAccount}}),
		"list Leases elsewhere":     rd.List(ctx, &coordinationv1.LeaseList{}, client.InNamespace(other)),
		"create a Lease elsewhere":  createLease(ctx, rd, other),
		"read the controller's SA":  rd.Get(ctx, client.ObjectKey{Namespace: controllerNamespace, Name: "stoke-controller"}, &corev1.ServiceAccount{}),
		"read a Deployment":         rd.Get(ctx, client.ObjectKey{Namespace: ns, Name: "bash"}, &appsv1.Deployment{}),
		"list Runtimes":             rd.List(ctx, &v1alpha1.RuntimeList{}, client.InNamespace(ns)),
		"read namespaces":           rd.List(ctx, &corev1.NamespaceList{}),
		"create a Pod in its space": rd.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "stoke"}}}}),
	}
	for what, err := range forbidden {
		if !apierrors.IsForbidden(err) {
			t.Errorf("runtimed may %s: got %v, want Forbidden", what, err)
		}
	}
	if err := createLease(ctx, rd, ns); err != nil {
		t.Errorf("runtimed cannot create a Lease in its namespace: %v", err)
	}
}

func createLease(ctx context.Context, cl client.Client, ns string) error {
	return cl.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "runtimed-test"}})
}

// TestStatusFollowsPodsAndRuns marks the Runtime's Pods Ready as a kubelet
// would (no node runs them here) and assigns Runs to them as the scheduler
// would: status.readyPods and status.freeSlots follow.
func TestStatusFollowsPodsAndRuns(t *testing.T) {
	c := kubetest.Shared(t)
	startController(t, c)
	cl, err := client.NewWithWatch(c.Config, client.Options{Scheme: newScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	ns := c.Namespace(t)
	rt := &v1alpha1.Runtime{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sh"},
		Spec:       v1alpha1.RuntimeSpec{Server: "bash", Replicas: 2, Runs: 3},
	}
	if err := cl.Create(ctx, rt); err != nil {
		t.Fatal(err)
	}
	var pods []*corev1.Pod
	until(t, cl, ns, &corev1.PodList{}, &corev1.Pod{}, "two Pods", func(items []client.Object) bool {
		pods = pods[:0]
		for _, o := range items {
			pods = append(pods, o.(*corev1.Pod))
		}
		return len(pods) == 2
	})
	status := func(what string, ready, free int32) {
		t.Helper()
		until(t, cl, ns, &v1alpha1.RuntimeList{}, &v1alpha1.Runtime{}, what, func(items []client.Object) bool {
			for _, o := range items {
				if r := o.(*v1alpha1.Runtime); r.Name == "sh" {
					return r.Status.ReadyPods == ready && r.Status.FreeSlots == free
				}
			}
			return false
		})
	}
	// setReady writes a Pod's status as a kubelet would; the scheduler
	// writes it too (PodScheduled, no node here), hence the re-reads.
	setReady := func(p *corev1.Pod, ip string, ready corev1.ConditionStatus) {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			if err := cl.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
				return err
			}
			p.Status.Phase = corev1.PodRunning
			p.Status.PodIP = ip
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: ready, LastTransitionTime: metav1.Now()}}
			return cl.Status().Update(ctx, p)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range pods {
		setReady(p, fmt.Sprintf("127.0.0.%d", 10+i), corev1.ConditionTrue)
	}
	status("two ready Pods with three slots each", 2, 6)

	runs := make([]*v1alpha1.Run, 2)
	for i := range runs {
		runs[i] = &v1alpha1.Run{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("r%d", i)},
			Spec:       v1alpha1.RunSpec{Runtime: "sh", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"true"}}}},
		}
		if err := cl.Create(ctx, runs[i]); err != nil {
			t.Fatal(err)
		}
		runs[i].Status = v1alpha1.RunStatus{Phase: v1alpha1.PhaseRunning, Attempt: 1, AssignedPod: pods[0].Name, AssignedPodUID: string(pods[0].UID)}
		if err := cl.Status().Update(ctx, runs[i]); err != nil {
			t.Fatal(err)
		}
	}
	status("two Runs held on one Pod", 2, 4)

	runs[0].Status.Phase = v1alpha1.PhaseSucceeded
	if err := cl.Status().Update(ctx, runs[0]); err != nil {
		t.Fatal(err)
	}
	status("one Run finished", 2, 5)

	setReady(pods[0], "127.0.0.10", corev1.ConditionFalse)
	status("the Pod holding a Run NotReady", 1, 3)
}

// The runtime-server token the controller mints for a template's
// ServiceAccount is bound to the namespace's token Secret, so it stops
// authenticating on the API server (TokenReview) once the Runtime no
// longer asks for it: when the Runtime turns the token off, names another
// ServiceAccount, or is deleted, the Secret is removed or made anew, and
// the old token is refused although its ServiceAccount is still there (a
// token not bound to the Secret would still pass); the other
// ServiceAccount's new token passes.
func TestRuntimeServerTokenDiesWithItsSecret(t *testing.T) {
	c := kubetest.Shared(t)
	startController(t, c)
	cl, err := client.NewWithWatch(c.Config, client.Options{Scheme: newScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	kc, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	// review answers whom token authenticates as ("" for nobody).
	review := func(t *testing.T, token string) string {
		t.Helper()
		tr, err := kc.AuthenticationV1().TokenReviews().Create(t.Context(), &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !tr.Status.Authenticated {
			return ""
		}
		return tr.Status.User.Username
	}
	const name = "sa"
	for _, tc := range []struct {
		name   string
		change func(ctx context.Context, rt *v1alpha1.Runtime) error
		newSA  string // the ServiceAccount a new token is for, if any
	}{
		{"TokenOff", func(ctx context.Context, rt *v1alpha1.Runtime) error {
			rt.Spec.Template.AutomountServiceAccountToken = ptr.To(false)
			return cl.Update(ctx, rt)
		}, ""},
		{"AnotherServiceAccount", func(ctx context.Context, rt *v1alpha1.Runtime) error {
			rt.Spec.Template.ServiceAccountName = "writer"
			return cl.Update(ctx, rt)
		}, "writer"},
		{"RuntimeDeleted", func(ctx context.Context, rt *v1alpha1.Runtime) error {
			return cl.Delete(ctx, rt)
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			ns := c.Namespace(t)
			for _, sa := range []string{"reader", "writer"} {
				if err := cl.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}}); err != nil {
					t.Fatal(err)
				}
			}
			rt := &v1alpha1.Runtime{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
				Spec: v1alpha1.RuntimeSpec{Server: "bash", Replicas: 1, Runs: 1,
					Template: &v1alpha1.RuntimeTemplate{ServiceAccountName: "reader"}},
			}
			if err := cl.Create(ctx, rt); err != nil {
				t.Fatal(err)
			}
			// tokenIn waits for the Secret to hold a token for the
			// Runtime, other than not, and returns it.
			tokenIn := func(what string, not types.UID) (string, types.UID) {
				var tok string
				var uid types.UID
				until(t, cl, ns, &corev1.SecretList{}, &corev1.Secret{}, what, func(items []client.Object) bool {
					for _, o := range items {
						if s := o.(*corev1.Secret); s.Name == runtimeset.TokenSecret && s.UID != not && len(s.Data[name+".token"]) > 0 {
							tok, uid = string(s.Data[name+".token"]), s.UID
							return true
						}
					}
					return false
				})
				return tok, uid
			}
			old, oldUID := tokenIn("the reader's token in "+runtimeset.TokenSecret, "")
			if got, want := review(t, old), "system:serviceaccount:"+ns+":reader"; got != want {
				t.Fatalf("the minted token reviews as %q, want %q", got, want)
			}

			if err := tc.change(ctx, rt); err != nil {
				t.Fatal(err)
			}
			if tc.newSA != "" {
				tok, _ := tokenIn("a new Secret holding the "+tc.newSA+"'s token", oldUID)
				if got, want := review(t, tok), "system:serviceaccount:"+ns+":"+tc.newSA; got != want {
					t.Errorf("the new token reviews as %q, want %q", got, want)
				}
			} else {
				until(t, cl, ns, &corev1.SecretList{}, &corev1.Secret{}, runtimeset.TokenSecret+" gone", func(items []client.Object) bool {
					return !slices.ContainsFunc(items, func(o client.Object) bool { return o.GetName() == runtimeset.TokenSecret })
				})
			}
			// The API server keeps a token's successful authentication
			// for 10 s (kube-apiserver's TokenSuccessCacheTTL) and reads
			// the bound Secret from its informer, and neither tells
			// anyone when it lets go: so the old token is reviewed again
			// until refused, within a bound that only a token not bound
			// to the Secret (refused never) exceeds.
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			tick := time.NewTicker(200 * time.Millisecond)
			defer tick.Stop()
			for got := review(t, old); got != ""; got = review(t, old) {
				select {
				case <-ctx.Done():
					t.Fatalf("a minute after the change the old token still authenticates, as %q", got)
				case <-tick.C:
				}
			}
			// The old token's ServiceAccount is still there: only the
			// binding to the Secret refuses the token.
			if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: "reader"}, &corev1.ServiceAccount{}); err != nil {
				t.Fatal(err)
			}
		})
	}
}
