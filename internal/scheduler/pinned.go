package scheduler

import (
	"container/heap"
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// maxGone bounds the names of gone pods the scheduler keeps for messages.
const maxGone = 4096

// decidePinned queues a Run pinned to a pod (spec.placement.podUID) on
// that pod, or ends it Unschedulable when the pod is not a ready pod of
// the Run's Runtime.
func (s *Scheduler) decidePinned(ctx context.Context, rs *runState, run *v1alpha1.Run, p *poolState) {
	ps := s.pods[rs.pin]
	if ps == nil || podPool(ps.pod) != rs.pool {
		s.unwait(rs)
		s.write(ctx, rs, run, job{kind: jobPinnedGone, message: s.pinnedMessage(rs, ps)})
		return
	}
	if rs.index < 0 {
		q := s.pinned[rs.pin]
		if q == nil {
			q = &runHeap{}
			s.pinned[rs.pin] = q
		}
		s.enqueue(q, rs)
	}
	s.dirty[p.key] = struct{}{}
	if waitingForPodWritten(run) || s.used[ps.pod.UID] < int(ps.pod.Slots) {
		return
	}
	if at := rs.since.Add(s.cfg.UnschedulableAfter); s.clk.Now().Before(at) {
		s.after(rs, at)
		return
	}
	s.unwait(rs)
	s.write(ctx, rs, run, job{kind: jobPinnedWaiting, message: fmt.Sprintf(
		"waiting for a slot of pod %s (spec.placement.podUID), whose %d slots other Runs hold", ps.pod.Name, ps.pod.Slots)})
}

// waitingForPodWritten reports whether run already says it waits for its
// pinned pod.
func waitingForPodWritten(run *v1alpha1.Run) bool {
	if run.Status.Phase != v1alpha1.PhasePending {
		return false
	}
	c := meta.FindStatusCondition(run.Status.Conditions, ConditionScheduled)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == ReasonWaitingForPod
}

// schedulePinned gives ps's free slots to the Runs pinned to it.
func (s *Scheduler) schedulePinned(ctx context.Context, p *poolState, ps *podState, now time.Time) {
	q := s.pinned[ps.pod.UID]
	for q != nil && q.Len() > 0 && s.used[ps.pod.UID] < int(ps.pod.Slots) {
		rs := heap.Pop(q).(*runState)
		s.waiting.Add(-1)
		s.hand(ctx, p, ps, rs, now)
	}
	if q != nil && q.Len() == 0 {
		delete(s.pinned, ps.pod.UID)
	}
}

// pinnedMessage says why a pinned Run cannot run: ps is its pod when that
// is a ready pod of another Runtime, else nil.
func (s *Scheduler) pinnedMessage(rs *runState, ps *podState) string {
	switch name, gone := s.gone[rs.pin]; {
	case ps != nil:
		return fmt.Sprintf("spec.placement.podUID %s is pod %s of runtime %s, not of runtime %s",
			rs.pin, ps.pod.Name, podPool(ps.pod).String(), rs.pool.String())
	case gone:
		return fmt.Sprintf("pod %s (UID %s), which spec.placement.podUID names, is gone", name, rs.pin)
	default:
		return fmt.Sprintf("no ready pod of runtime %s has UID %s (spec.placement.podUID): it is gone or never was one", rs.pool.String(), rs.pin)
	}
}
