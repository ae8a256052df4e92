package runtimeset

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// Status is a Runtime's status computed from its Pods and the Runs of its
// namespace: ready Pods (Ready condition true, not being deleted), and the
// free slots of those Pods — spec.runs each, less the Runs assigned to it
// in a phase that holds a slot, never below zero. A Pod whose runtimed
// stopped renewing its Lease still counts until its readiness probe fails;
// the scheduler (internal/kubepods) also checks the Lease. Conditions are
// kept as they are.
func Status(rt *v1alpha1.Runtime, pods []corev1.Pod, runs []*v1alpha1.Run) v1alpha1.RuntimeStatus {
	held := map[string]int32{}
	for _, run := range runs {
		if run.Spec.Runtime == rt.Name && run.Status.Phase.HoldsSlot() && run.Status.AssignedPodUID != "" {
			held[run.Status.AssignedPodUID]++
		}
	}
	st := v1alpha1.RuntimeStatus{Conditions: rt.Status.Conditions}
	for i := range pods {
		pod := &pods[i]
		if pod.Labels[LabelRuntime] != rt.Name {
			continue
		}
		ready := podReady(pod)
		ps := v1alpha1.PodStatus{Name: pod.Name, UID: string(pod.UID), Ready: ready}
		if pod.Status.PodIP != "" {
			ps.Address = net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(HopPort))
		}
		st.Pods = append(st.Pods, ps)
		if ready {
			st.ReadyPods++
			st.FreeSlots += max(rt.Spec.Runs-held[string(pod.UID)], 0)
		}
	}
	slices.SortFunc(st.Pods, func(a, b v1alpha1.PodStatus) int { return strings.Compare(a.Name, b.Name) })
	return st
}

func podReady(pod *corev1.Pod) bool {
	if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// statusWriter is the "runtime-status" controller.
type statusWriter struct {
	client client.Client
	opts   Options

	mu sync.Mutex
	// written is when each Runtime's status was last written, so that a
	// busy Runtime's status is written at most once per StatusInterval.
	written map[types.NamespacedName]time.Time
}

// setupStatus adds the "runtime-status" controller. Its Runs come from
// opts.Runs, the leader's informer of Runs, not from a watch of the
// manager's cache: the controller process decodes each Run event once.
func setupStatus(mgr ctrl.Manager, opts Options) error {
	w := &statusWriter{client: mgr.GetClient(), opts: opts, written: map[types.NamespacedName]time.Time{}}
	return ctrl.NewControllerManagedBy(mgr).
		Named("runtime-status").
		// Its own status writes do not change the generation.
		For(&v1alpha1.Runtime{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(podRuntime), builder.WithPredicates(predicate.NewPredicateFuncs(isRuntimePod))).
		WatchesRawSource(opts.Runs.source()).
		Complete(w)
}

func isRuntimePod(o client.Object) bool { return o.GetLabels()[LabelRuntime] != "" }

func podRuntime(_ context.Context, o client.Object) []reconcile.Request {
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetLabels()[LabelRuntime]}}}
}

// Reconcile writes one Runtime's status when it changed; within
// StatusInterval of its last write it comes back once that has passed.
func (w *statusWriter) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var rt v1alpha1.Runtime
	if err := w.client.Get(ctx, req.NamespacedName, &rt); err != nil {
		w.mu.Lock()
		delete(w.written, req.NamespacedName)
		w.mu.Unlock()
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	// A Runtime written to less than StatusInterval ago waits, before any
	// work: a busy Runtime's Runs change many times a second.
	now := w.opts.Clock.Now()
	w.mu.Lock()
	last, ok := w.written[req.NamespacedName]
	w.mu.Unlock()
	if wait := w.opts.StatusInterval - now.Sub(last); ok && wait > 0 {
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	// Read-only lists straight from the cache, without copies.
	var pods corev1.PodList
	if err := w.client.List(ctx, &pods, client.InNamespace(rt.Namespace), client.MatchingLabels{LabelRuntime: rt.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return ctrl.Result{}, fmt.Errorf("runtime %s: list pods: %w", req, err)
	}
	runs, err := w.opts.Runs.held(ctx, rt.Namespace, rt.Name)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("runtime %s: runs: %w", req, err)
	}
	st := Status(&rt, pods.Items, runs)
	if equality.Semantic.DeepEqual(st, rt.Status) {
		return ctrl.Result{}, nil
	}
	base := rt.DeepCopy()
	rt.Status = st
	if err := w.client.Status().Patch(ctx, &rt, client.MergeFrom(base)); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(fmt.Errorf("runtime %s: status: %w", req, err))
	}
	w.mu.Lock()
	w.written[req.NamespacedName] = now
	w.mu.Unlock()
	return ctrl.Result{}, nil
}
