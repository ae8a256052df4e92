package kubepods

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/podsource"
)

var t0 = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

func testPod(readyStatus corev1.ConditionStatus, ip string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "bash-abc", UID: "uid-1", Labels: map[string]string{LabelRuntime: "bash"}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: readyStatus}}},
	}
}

// decide's rules, one row each; the Kubernetes tests drive the same
// transitions through a real API server.
func TestDecide(t *testing.T) {
	rt := &v1alpha1.Runtime{Spec: v1alpha1.RuntimeSpec{Server: "bash", Runs: 8}}
	fresh := leaseView{held: true, freshTill: t0.Add(5 * time.Second)}
	deleted := testPod(corev1.ConditionTrue, "127.0.0.2")
	deleted.DeletionTimestamp = &metav1.Time{Time: t0}
	failed := testPod(corev1.ConditionTrue, "127.0.0.2")
	failed.Status.Phase = corev1.PodFailed
	later := t0.Add(time.Minute)
	for _, c := range []struct {
		name      string
		pod       *corev1.Pod
		rt        *v1alpha1.Runtime
		lease     leaseView
		deadline  time.Time
		announced bool
		want      verdict
	}{
		{"ready with a fresh lease", testPod(corev1.ConditionTrue, "127.0.0.2"), rt, fresh, later, false,
			verdict{announce: true, slots: 8, recheck: fresh.freshTill}},
		{"ready without its runtime", testPod(corev1.ConditionTrue, "127.0.0.2"), nil, fresh, later, true,
			verdict{announce: true, recheck: fresh.freshTill}},
		{"ready without an IP yet", testPod(corev1.ConditionTrue, ""), rt, fresh, later, false,
			verdict{announce: true, recheck: fresh.freshTill}},
		{"ready, no lease yet", testPod(corev1.ConditionTrue, "127.0.0.2"), rt, leaseView{}, later, false, verdict{}},
		{"ready, lease expired, never announced", testPod(corev1.ConditionTrue, "127.0.0.2"), rt,
			leaseView{held: true, freshTill: t0}, later, false, verdict{}},
		{"lease expired", testPod(corev1.ConditionTrue, "127.0.0.2"), rt, leaseView{held: true, freshTill: t0}, later, true,
			verdict{gone: podsource.ReasonLeaseExpired}},
		{"lease taken by another holder", testPod(corev1.ConditionTrue, "127.0.0.2"), rt, leaseView{}, later, true,
			verdict{gone: podsource.ReasonLeaseExpired}},
		{"not ready within the grace", testPod(corev1.ConditionFalse, "127.0.0.2"), rt, fresh, t0.Add(time.Second), true,
			verdict{announce: true, recheck: t0.Add(time.Second)}},
		{"not ready past the grace", testPod(corev1.ConditionFalse, "127.0.0.2"), rt, fresh, t0, true,
			verdict{gone: podsource.ReasonNotReady}},
		{"deleted", deleted, rt, fresh, later, true, verdict{gone: podsource.ReasonPodDeleted}},
		{"finished", failed, rt, fresh, later, true, verdict{gone: podsource.ReasonExited}},
	} {
		if got := decide(c.pod, c.rt, c.lease, t0, c.deadline, c.announced); got != c.want {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestPodOf(t *testing.T) {
	rt := &v1alpha1.Runtime{Spec: v1alpha1.RuntimeSpec{Server: "python", Runs: 4}}
	got := podOf(testPod(corev1.ConditionTrue, "127.0.0.7"), rt, 4)
	want := podsource.Pod{Namespace: "ns", Runtime: "bash", Name: "bash-abc", UID: "uid-1", Server: "python", Slots: 4,
		Addr: "127.0.0.7:7443", WorkspaceRoot: "/workspace"}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}
