package scheduler

import (
	"container/heap"
	"context"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/placement"
	"stoke.dev/stoke/internal/retry"
)

// runState is what the scheduler knows about one non-terminal Run.
type runState struct {
	key     informer.Key
	uid     types.UID
	pool    informer.Key // namespace and spec.runtime
	created time.Time
	seq     uint64 // order first seen, for FIFO within a second
	rv      string // the version last synced

	// slot is the pod UID the Run counts against ("" for none): its
	// assignment while its phase holds a slot, or reserved.
	slot string
	// reserved is the pod of an assignment written (or being written) on
	// top of version reservedBase, until the informer shows a newer
	// version.
	reserved, reservedBase string

	// busy is set while a write for the Run is in flight; the Run is not
	// decided again until its result is in.
	busy bool
	// holdRV: do not decide while the informer still shows this version
	// (a write on it conflicted; the newer version is on its way).
	holdRV string
	// retryAt: after a failed write, do not write again before this.
	retryAt time.Time

	// pin is spec.placement.podUID: the only pod the Run may take.
	pin string
	// placedAt is when the Run, placed at its create, first held its
	// pod's slot waiting for that pod's runtimed (placed.go).
	placedAt time.Time

	index    int       // position in queue; -1 when not waiting
	queue    *runHeap  // the heap it waits in: its pool's, or its pod's for a pinned Run
	since    time.Time // when this attempt was first seen waiting
	unschedQ bool      // queued in its pool's due list
	// heldSince is when the Run was first seen held (spec.held).
	heldSince time.Time
}

func poolOf(run *v1alpha1.Run) informer.Key {
	return informer.Key{Namespace: informer.KeyOf(run).Namespace, Name: run.Spec.Runtime}
}

// sync brings the state of one Run in line with the informer's copy and
// decides what to do with it.
func (s *Scheduler) sync(ctx context.Context, k informer.Key) {
	run, ok := s.get(k)
	rs := s.runs[k]
	if rs != nil && (!ok || run.UID != rs.uid) {
		s.forget(rs)
		rs = nil
	}
	if !ok {
		return
	}
	if rs == nil {
		if run.Status.Phase.Terminal() {
			return
		}
		s.seq++
		rs = &runState{key: k, uid: run.UID, pool: poolOf(run), created: run.CreationTimestamp.Time, seq: s.seq, index: -1}
		if pl := run.Spec.Placement; pl != nil {
			rs.pin = pl.PodUID
		}
		s.runs[k] = rs
	}
	if rs.rv != run.ResourceVersion {
		rs.rv = run.ResourceVersion
		rs.holdRV = ""
	}
	if rs.reserved != "" && rs.reservedBase != run.ResourceVersion {
		rs.reserved, rs.reservedBase = "", ""
	}
	s.setSlot(rs, slotOf(run, rs))
	if run.Status.Phase.Terminal() {
		s.forget(rs)
		return
	}
	if rs.busy || rs.holdRV == run.ResourceVersion {
		return
	}
	s.decide(ctx, rs, run)
}

// slotOf is the pod UID whose slot run takes.
func slotOf(run *v1alpha1.Run, rs *runState) string {
	if rs.reserved != "" {
		return rs.reserved
	}
	if run.Status.Phase.HoldsSlot() {
		return run.Status.AssignedPodUID
	}
	return ""
}

// setSlot moves rs's slot to pod UID uid ("" for none); a freed slot makes
// its pool try its waiting Runs.
func (s *Scheduler) setSlot(rs *runState, uid string) {
	if rs.slot == uid {
		return
	}
	if old := rs.slot; old != "" {
		if s.used[old]--; s.used[old] <= 0 {
			delete(s.used, old)
		}
		s.dirty[rs.pool] = struct{}{}
		if ps := s.pods[old]; ps != nil {
			s.dirty[podPool(ps.pod)] = struct{}{}
		}
	}
	if uid != "" {
		s.used[uid]++
	}
	rs.slot = uid
}

// forget drops a Run that ended or went away, releasing its slot.
func (s *Scheduler) forget(rs *runState) {
	s.setSlot(rs, "")
	s.unwait(rs)
	delete(s.runs, rs.key)
}

// decide handles a Run that is not being written.
func (s *Scheduler) decide(ctx context.Context, rs *runState, run *v1alpha1.Run) {
	phase := run.Status.Phase
	if run.DeletionTimestamp != nil || (phase != "" && phase != v1alpha1.PhasePending) {
		s.unwait(rs)
		rs.since = time.Time{}
		return
	}
	now := s.clk.Now()
	if now.Before(rs.retryAt) {
		s.unwait(rs)
		s.after(rs, rs.retryAt)
		return
	}
	if run.Spec.CancelRequested {
		s.unwait(rs)
		s.write(ctx, rs, run, job{kind: jobCancel})
		return
	}
	if run.Spec.Held {
		s.unwait(rs)
		rs.since = time.Time{}
		if heldWritten(run) {
			return
		}
		if rs.heldSince.IsZero() {
			rs.heldSince = now
		}
		// A hold cleared at once (`docker run`: create, then start) costs
		// no write.
		if at := rs.heldSince.Add(s.cfg.UnschedulableAfter); now.Before(at) {
			s.after(rs, at)
			return
		}
		s.write(ctx, rs, run, job{kind: jobHeld, message: "held (spec.held): created and not started; `docker start` (clearing spec.held) schedules it"})
		return
	}
	rs.heldSince = time.Time{}
	if nb, ok := retry.NotBefore(run); ok && now.Before(nb) {
		s.unwait(rs)
		rs.since = time.Time{}
		s.after(rs, nb)
		return
	}
	if rs.since.IsZero() {
		rs.since = now
	}
	if until, ok := s.deferred(rs.key, now); ok {
		// Its creator's other creates come first (Defer); the wait counts
		// in its scheduling latency.
		s.unwait(rs)
		s.after(rs, until)
		return
	}
	p := s.pool(rs.pool)
	if !s.runtimeExists(p) {
		s.unwait(rs)
		s.write(ctx, rs, run, job{kind: jobRuntimeCheck})
		return
	}
	if placement.Unclaimed(run) != "" {
		s.decidePlaced(ctx, rs, run, p)
		return
	}
	if rs.pin != "" {
		s.decidePinned(ctx, rs, run, p)
		return
	}
	if rs.index < 0 {
		s.enqueue(&p.waiting, rs)
	}
	s.dirty[p.key] = struct{}{}
	if unschedulableWritten(run) {
		return
	}
	if at := rs.since.Add(s.cfg.UnschedulableAfter); now.Before(at) {
		s.after(rs, at)
		return
	}
	if at := s.stuckAt(p); now.Before(at) {
		// The pool is draining: the Run waits its turn.
		s.afterPool(p, at)
		return
	}
	if !rs.unschedQ {
		rs.unschedQ = true
		p.due = append(p.due, rs)
	}
}

// unschedulableWritten reports whether run already says it is
// unschedulable.
func unschedulableWritten(run *v1alpha1.Run) bool {
	if run.Status.Phase != v1alpha1.PhasePending {
		return false
	}
	c := meta.FindStatusCondition(run.Status.Conditions, ConditionScheduled)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == ReasonUnschedulable
}

// heldWritten reports whether run already says it is held.
func heldWritten(run *v1alpha1.Run) bool {
	if run.Status.Phase != v1alpha1.PhasePending {
		return false
	}
	c := meta.FindStatusCondition(run.Status.Conditions, ConditionScheduled)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == ReasonHeld
}

// enqueue makes rs wait in q.
func (s *Scheduler) enqueue(q *runHeap, rs *runState) {
	rs.queue = q
	heap.Push(q, rs)
	s.waiting.Add(1)
}

// unwait takes rs out of the queue it waits in.
func (s *Scheduler) unwait(rs *runState) {
	if rs.index >= 0 {
		heap.Remove(rs.queue, rs.index)
		s.waiting.Add(-1)
		if rs.pin != "" && rs.queue.Len() == 0 && s.pinned[rs.pin] == rs.queue {
			delete(s.pinned, rs.pin)
		}
	}
}

// after makes the timer sync rs at t (or earlier, if it is armed
// earlier).
func (s *Scheduler) after(rs *runState, t time.Time) {
	s.loop.After(t, loopKey{keyRun, rs.key})
}

// runHeap orders waiting Runs oldest first: creationTimestamp, then the
// order the scheduler first saw them (creationTimestamp has whole-second
// precision; the watch delivers creations in commit order).
type runHeap []*runState

func (h runHeap) Len() int { return len(h) }

func (h runHeap) Less(i, j int) bool {
	if !h[i].created.Equal(h[j].created) {
		return h[i].created.Before(h[j].created)
	}
	return h[i].seq < h[j].seq
}

func (h runHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}

func (h *runHeap) Push(x any) {
	rs := x.(*runState)
	rs.index = len(*h)
	*h = append(*h, rs)
}

func (h *runHeap) Pop() any {
	old := *h
	rs := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	rs.index = -1
	return rs
}
