package runtimeset_test

import (
	"context"
	"os"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/kubetest"
	"stoke.dev/stoke/internal/kubetest/nodeagent"
	"stoke.dev/stoke/internal/runtimeset"
	"stoke.dev/stoke/internal/testbin"
)

// TestRuntimePodsBecomeReady runs a Runtime's Pods for real: the real
// scheduler binds them to the test node agent, which runs the two
// containers of the reconciler's template from the freshly built stoke
// (runtime-server and runtimed, with the TLS Secret, the ServiceAccount
// token and the downward API); runtimed reaches the API server as
// stoke-runtimed under its Role, renews its Pod's Lease and answers its
// exec readiness probe, so the Runtime's status counts both Pods ready with
// all their slots free. Deleting the Runtime stops them.
func TestRuntimePodsBecomeReady(t *testing.T) {
	stoke, cleanup, err := testbin.Stoke()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	c := kubetest.Shared(t)
	startController(t, c)
	agent := nodeagent.StartTest(t, nodeagent.Config{RESTConfig: c.Config, NodeName: "stoke-node-1", Stoke: stoke})
	cl, err := client.NewWithWatch(c.Config, client.Options{Scheme: newScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	ns := c.Namespace(t)
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		var pods corev1.PodList
		if err := cl.List(context.Background(), &pods, client.InNamespace(ns)); err != nil {
			t.Log(err)
			return
		}
		for _, p := range pods.Items {
			t.Logf("pod %s: phase %s, conditions %+v", p.Name, p.Status.Phase, p.Status.Conditions)
			res, err := agent.Exec(context.Background(), ns, p.Name, runtimeset.ContainerRuntimed, []string{"stoke", "runtimed", "probe", "--probe-socket", runtimeset.ProbeSocket}, 5*time.Second)
			t.Logf("pod %s: the probe by hand: %+v %v", p.Name, res, err)
			for _, ctr := range p.Spec.Containers {
				path, err := agent.LogPath(ns, p.Name, ctr.Name)
				if err != nil {
					t.Logf("%s/%s: %v", p.Name, ctr.Name, err)
					continue
				}
				b, _ := os.ReadFile(path)
				t.Logf("%s/%s's log:\n%s", p.Name, ctr.Name, b[max(0, len(b)-4096):])
			}
		}
	})
	rt := &v1alpha1.Runtime{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bash"},
		Spec:       v1alpha1.RuntimeSpec{Server: "bash", Replicas: 2, Runs: 4},
	}
	if err := cl.Create(ctx, rt); err != nil {
		t.Fatal(err)
	}
	var pods []*corev1.Pod
	until(t, cl, ns, &v1alpha1.RuntimeList{}, &v1alpha1.Runtime{}, "two ready Pods with eight free slots", func(items []client.Object) bool {
		for _, o := range items {
			if r := o.(*v1alpha1.Runtime); r.Name == "bash" {
				return r.Status.ReadyPods == 2 && r.Status.FreeSlots == 8
			}
		}
		return false
	})
	until(t, cl, ns, &corev1.PodList{}, &corev1.Pod{}, "the Pods", func(items []client.Object) bool {
		pods = pods[:0]
		for _, o := range items {
			pods = append(pods, o.(*corev1.Pod))
		}
		return len(pods) == 2
	})
	for _, p := range pods {
		var lease coordinationv1.Lease
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: p.Name}, &lease); err != nil {
			t.Fatalf("pod %s's Lease: %v", p.Name, err)
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != string(p.UID) {
			t.Errorf("pod %s's Lease is held by %v, not the Pod's UID", p.Name, lease.Spec.HolderIdentity)
		}
		if p.Spec.NodeName != "stoke-node-1" || p.Status.PodIP == "" {
			t.Errorf("pod %s on node %q with IP %q", p.Name, p.Spec.NodeName, p.Status.PodIP)
		}
	}
	if err := cl.Delete(ctx, rt); err != nil {
		t.Fatal(err)
	}
	until(t, cl, ns, &corev1.PodList{}, &corev1.Pod{}, "the Pods gone with the Runtime", func(items []client.Object) bool {
		return len(items) == 0
	})
}
