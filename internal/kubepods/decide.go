package kubepods

import (
	"net"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/podsource"
)

// verdict is what one look at a Pod decides.
type verdict struct {
	// schedulable: announce the pod (PodReady) with slots; slots 0 means
	// it is alive but takes no new Runs for now.
	announce bool
	slots    int32
	// gone, when set, is the PodGone reason: fence the pod.
	gone string
	// recheck, when set, is when the verdict may change without an event
	// (the Lease runs out, the NotReady grace ends).
	recheck time.Time
}

// leaseView is the pod's Lease as the source judges it: present and held
// by the pod, and until when it counts as fresh.
type leaseView struct {
	held      bool
	freshTill time.Time
}

// decide looks at a Pod, its Runtime (nil when there is none) and its
// Lease at now. announced says whether the pod was already announced;
// notReadyDeadline is when a Pod that is not Ready is fenced.
//
// The rules (package doc): a deleted or finished Pod is gone; a Pod whose
// Lease is not fresh is gone when it was announced and waits otherwise; a
// Ready Pod of an existing Runtime takes spec.runs Runs; an alive Pod that
// is not Ready takes none until notReadyDeadline, and is gone after.
func decide(pod *corev1.Pod, rt *v1alpha1.Runtime, lease leaseView, now, notReadyDeadline time.Time, announced bool) verdict {
	if pod.DeletionTimestamp != nil {
		return verdict{gone: podsource.ReasonPodDeleted}
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return verdict{gone: podsource.ReasonExited}
	}
	if !lease.held || !now.Before(lease.freshTill) {
		if announced {
			return verdict{gone: podsource.ReasonLeaseExpired}
		}
		return verdict{} // not started yet: its Lease's first renewal is an event
	}
	if ready(pod) {
		if rt == nil {
			// The Runtime is gone (its Pods follow by garbage collection)
			// or not seen yet.
			return verdict{announce: true, recheck: lease.freshTill}
		}
		return verdict{announce: true, slots: rt.Spec.Runs, recheck: lease.freshTill}
	}
	if !now.Before(notReadyDeadline) {
		return verdict{gone: podsource.ReasonNotReady}
	}
	return verdict{announce: true, recheck: earliest(notReadyDeadline, lease.freshTill)}
}

// ready reports whether the Pod's Ready condition is True and it has an
// IP.
func ready(pod *corev1.Pod) bool {
	if pod.Status.PodIP == "" {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// podOf is the pod as the control plane sees it.
func podOf(pod *corev1.Pod, rt *v1alpha1.Runtime, slots int32) podsource.Pod {
	p := podsource.Pod{
		Namespace:     pod.Namespace,
		Runtime:       pod.Labels[LabelRuntime],
		Name:          pod.Name,
		UID:           string(pod.UID),
		Slots:         slots,
		WorkspaceRoot: WorkspaceRoot,
	}
	if pod.Status.PodIP != "" {
		p.Addr = net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(HopPort))
	}
	if rt != nil {
		p.Server = rt.Spec.Server
		p.Lambda = rt.Spec.Lambda
	}
	return p
}
