package deploy

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/kubetest"
	"stoke.dev/stoke/internal/placement"
	"stoke.dev/stoke/internal/runtimeset"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/kube"
)

func TestMain(m *testing.M) { kubetest.Main(m, kubetest.Options{}) }

// policyBound bounds the wait for the API server to load a policy just
// applied: it learns of it through an informer and says nothing when.
const policyBound = time.Minute

// runtimedPod is a runtime Pod (never scheduled: only its identity matters)
// and runtimed's clients with a token bound to it.
type runtimedPod struct {
	pod    *corev1.Pod
	runs   store.Resource[*v1alpha1.Run]
	leases kubernetes.Interface
}

// TestRuntimedPolicy checks deploy/controller/runtimed-policy.yaml on a
// real API server: runtimed's credentials — its ServiceAccount with the
// reconciler's Role, and a token bound to its Pod — write the Runs and the
// Lease of that Pod, and are refused those of another Pod, and a token of
// the same ServiceAccount bound to no Pod writes nothing.
func TestRuntimedPolicy(t *testing.T) {
	c := kubetest.Shared(t)
	c.Kubectl(t, "apply", "-f", "controller/runtimed-policy.yaml")
	ns := c.Namespace(t)
	ctx := t.Context()
	admin, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	adminStore, err := kube.New(c.Config, kube.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { adminStore.Close() })
	runs := adminStore.Runs()
	grantRuntimedRole(t, admin, ns)

	a := newRuntimedPod(t, c, admin, ns, "bash-a")
	b := newRuntimedPod(t, c, admin, ns, "bash-b")
	runA := assignedRun(t, runs, ns, "run-a", a.pod)
	runB := assignedRun(t, runs, ns, "run-b", b.pod)

	// The policy is in force once a write it refuses is refused.
	awaitRefusal(t, func() error {
		r, err := runs.Get(ctx, ns, runB.Name)
		if err != nil {
			return err
		}
		_, err = a.runs.UpdateStatus(ctx, r)
		return err
	})
	if runB, err = runs.Get(ctx, ns, runB.Name); err != nil {
		t.Fatal(err)
	}

	// Its own Run: the status, and its finalizer.
	r := runA.DeepCopy()
	r.Status.Phase = v1alpha1.PhaseRunning
	runA, err = a.runs.UpdateStatus(ctx, r)
	if err != nil {
		t.Fatalf("runtimed of pod A updates the status of a Run assigned to A: %v", err)
	}
	r = runA.DeepCopy()
	r.Finalizers = append(r.Finalizers, v1alpha1.FinalizerRuntimed)
	if runA, err = a.runs.Update(ctx, r); err != nil {
		t.Fatalf("runtimed of pod A adds its finalizer to a Run assigned to A: %v", err)
	}

	// Another Pod's Run: neither its status nor its metadata.
	r = runB.DeepCopy()
	r.Status.Phase = v1alpha1.PhaseRunning
	_, err = a.runs.UpdateStatus(ctx, r)
	wantRefused(t, err, "runtimed of pod A updates the status of a Run assigned to B", "may change only the Runs assigned to its Pod")
	r = runB.DeepCopy()
	r.Finalizers = append(r.Finalizers, v1alpha1.FinalizerRuntimed)
	_, err = a.runs.Update(ctx, r)
	wantRefused(t, err, "runtimed of pod A adds its finalizer to a Run assigned to B", "may change only the Runs assigned to its Pod")
	if _, err := b.runs.UpdateStatus(ctx, runB.DeepCopy()); err != nil {
		t.Fatalf("runtimed of pod B updates the status of its own Run: %v", err)
	}

	// Its own Run handed to another Pod.
	r = runA.DeepCopy()
	r.Status.AssignedPod, r.Status.AssignedPodUID = b.pod.Name, string(b.pod.UID)
	_, err = a.runs.UpdateStatus(ctx, r)
	wantRefused(t, err, "runtimed of pod A assigns its Run to pod B", "may not assign a Run to another Pod")

	// A retry gives the Run back (assignment cleared); runtimed then
	// removes its finalizer, and may change nothing else.
	r = runA.DeepCopy()
	r.Status.Phase = v1alpha1.PhasePending
	r.Status.AssignedPod, r.Status.AssignedPodUID = "", ""
	if runA, err = a.runs.UpdateStatus(ctx, r); err != nil {
		t.Fatalf("runtimed of pod A gives its Run back to the scheduler: %v", err)
	}
	r = runA.DeepCopy()
	r.Status.Message = "after"
	_, err = a.runs.UpdateStatus(ctx, r)
	wantRefused(t, err, "runtimed of pod A updates the status of a Run it gave back", "assigned to no Pod")
	r = runA.DeepCopy()
	r.Labels = map[string]string{"stolen": "yes"}
	r.Finalizers = nil
	_, err = a.runs.Update(ctx, r)
	wantRefused(t, err, "runtimed of pod A labels a Run it gave back", "assigned to no Pod")
	r = runA.DeepCopy()
	r.Finalizers = slices.DeleteFunc(r.Finalizers, func(f string) bool { return f == v1alpha1.FinalizerRuntimed })
	if _, err = a.runs.Update(ctx, r); err != nil {
		t.Fatalf("runtimed of pod A removes its finalizer from a Run it gave back: %v", err)
	}

	// A function Run placed on pod A at its create, not written yet: A
	// takes it, assigning it to itself with its claim; B may not, nor may
	// A assign it elsewhere, nor take a Run placed so without the
	// annotation (a plain pinned Run, which the scheduler assigns).
	placed := placedRun(t, runs, ns, "placed-a", a.pod, true)
	pinned := placedRun(t, runs, ns, "pinned-a", a.pod, false)
	r = placed.DeepCopy()
	placement.Assign(r, b.pod.Name, string(b.pod.UID), time.Now())
	_, err = b.runs.UpdateStatus(ctx, r)
	wantRefused(t, err, "runtimed of pod B takes a Run placed on pod A", "may change only the Runs assigned to its Pod")
	_, err = a.runs.UpdateStatus(ctx, r)
	wantRefused(t, err, "runtimed of pod A assigns a Run placed on it to pod B", "may not assign a Run to another Pod")
	r = pinned.DeepCopy()
	placement.Assign(r, a.pod.Name, string(a.pod.UID), time.Now())
	_, err = a.runs.UpdateStatus(ctx, r)
	wantRefused(t, err, "runtimed of pod A takes a Run pinned to it, not placed", "may change only the Runs assigned to its Pod")
	r = placed.DeepCopy()
	placement.Assign(r, a.pod.Name, string(a.pod.UID), time.Now())
	r.Status.Phase = v1alpha1.PhaseReady
	if _, err := a.runs.UpdateStatus(ctx, r); err != nil {
		t.Fatalf("runtimed of pod A takes a Run placed on it: %v", err)
	}

	// Leases: its Pod's, held by its Pod's UID; no other.
	leases := a.leases.CoordinationV1().Leases(ns)
	if _, err := leases.Create(ctx, lease(a.pod.Name, a.pod.UID), metav1.CreateOptions{}); err != nil {
		t.Fatalf("runtimed of pod A creates its Lease: %v", err)
	}
	_, err = leases.Create(ctx, lease(b.pod.Name, b.pod.UID), metav1.CreateOptions{})
	wantAPIRefused(t, err, "runtimed of pod A creates pod B's Lease", "only the Lease named after its Pod")
	if _, err := b.leases.CoordinationV1().Leases(ns).Create(ctx, lease(b.pod.Name, b.pod.UID), metav1.CreateOptions{}); err != nil {
		t.Fatalf("runtimed of pod B creates its Lease: %v", err)
	}
	other, err := admin.CoordinationV1().Leases(ns).Get(ctx, b.pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other.Spec.HolderIdentity = ptr.To(string(a.pod.UID))
	_, err = leases.Update(ctx, other, metav1.UpdateOptions{})
	wantAPIRefused(t, err, "runtimed of pod A takes over pod B's Lease", "only the Lease named after its Pod")
	mine, err := leases.Get(ctx, a.pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mine.Spec.HolderIdentity = ptr.To(string(b.pod.UID))
	_, err = leases.Update(ctx, mine, metav1.UpdateOptions{})
	wantAPIRefused(t, err, "runtimed of pod A holds its Lease as pod B", "only as its Pod UID")

	// The same ServiceAccount with a token bound to no Pod.
	unbound, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, runtimeset.ServiceAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := kube.New(tokenConfig(c, unbound.Status.Token), kube.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	_, err = st.Runs().UpdateStatus(ctx, runB.DeepCopy())
	wantRefused(t, err, "a runtimed token bound to no Pod updates a Run's status", "token bound to its Pod")
}

// grantRuntimedRole makes runtimed's ServiceAccount, Role and RoleBinding
// in ns as the reconciler does.
func grantRuntimedRole(t *testing.T, admin kubernetes.Interface, ns string) {
	t.Helper()
	ctx := t.Context()
	name := runtimeset.ServiceAccount
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: runtimeset.RuntimedRules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// newRuntimedPod creates a runtime Pod named name and runtimed's clients
// with a token bound to it, as the kubelet's projected token is.
func newRuntimedPod(t *testing.T, c *kubetest.Cluster, admin kubernetes.Interface, ns, name string) runtimedPod {
	t.Helper()
	ctx := t.Context()
	pod, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{ServiceAccountName: runtimeset.ServiceAccount, Containers: []corev1.Container{
			{Name: "runtime-server", Image: "stoke"}, {Name: "runtimed", Image: "stoke"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, runtimeset.ServiceAccount, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To(int64(600)),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := tokenConfig(c, tr.Status.Token)
	st, err := kube.New(cfg, kube.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return runtimedPod{pod: pod, runs: st.Runs(), leases: cs}
}

// tokenConfig is a client configuration of the cluster with token alone.
func tokenConfig(c *kubetest.Cluster, token string) *rest.Config {
	return &rest.Config{Host: c.Config.Host, BearerToken: token,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.Config.CAData, CAFile: c.Config.CAFile}}
}

// assignedRun creates a task Run and assigns it to pod, as the scheduler
// does.
func assignedRun(t *testing.T, runs store.Resource[*v1alpha1.Run], ns, name string, pod *corev1.Pod) *v1alpha1.Run {
	t.Helper()
	run, err := runs.Create(t.Context(), &v1alpha1.Run{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Entrypoint: "task.sh"}},
			Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "task.sh", Text: "true\n"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	run.Status.Phase = v1alpha1.PhaseScheduled
	run.Status.AssignedPod, run.Status.AssignedPodUID = pod.Name, string(pod.UID)
	if run, err = runs.UpdateStatus(t.Context(), run); err != nil {
		t.Fatal(err)
	}
	return run
}

// placedRun creates a function Run placed on pod at its create, as the
// Function controller does (marked: with the placed annotation), or only
// pinned there.
func placedRun(t *testing.T, runs store.Resource[*v1alpha1.Run], ns, name string, pod *corev1.Pod, marked bool) *v1alpha1.Run {
	t.Helper()
	run := &v1alpha1.Run{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "fn.handle"}},
			Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "fn.sh", Text: "handle() { :; }\n"}}},
	}
	placement.Place(run, string(pod.UID))
	if !marked {
		delete(run.Annotations, v1alpha1.AnnotationPlaced)
	}
	run, err := runs.Create(t.Context(), run)
	if err != nil {
		t.Fatal(err)
	}
	return run
}

func lease(name string, holder types.UID) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(string(holder)), LeaseDurationSeconds: ptr.To(int32(10))}}
}

// awaitRefusal polls write until the API server refuses it: a policy just
// applied reaches the API server's admission through an informer, with no
// event a client can await.
func awaitRefusal(t *testing.T, write func() error) {
	t.Helper()
	deadline := time.Now().Add(policyBound)
	for {
		err := write()
		if errors.Is(err, errdefs.ErrPermissionDenied) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the policy refuses nothing within %v; the last write: %v", policyBound, err)
		}
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// wantRefused checks that a store write was refused with
// errdefs.ErrPermissionDenied and the policy's message.
func wantRefused(t *testing.T, err error, what, message string) {
	t.Helper()
	if !errors.Is(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), message) {
		t.Errorf("%s: got %v, want permission denied saying %q", what, err, message)
	}
}

// wantAPIRefused checks that an API call was refused with 403 Forbidden
// and the policy's message.
func wantAPIRefused(t *testing.T, err error, what, message string) {
	t.Helper()
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), message) {
		t.Errorf("%s: got %v, want 403 Forbidden saying %q", what, err, message)
	}
}
