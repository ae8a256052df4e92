package scheduler

import (
	"container/heap"
	"context"
	"fmt"
	"time"

	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/store"
)

// podState is one ready pod.
type podState struct {
	pod podsource.Pod
}

// poolState is one Runtime (namespace/name): its ready pods and its
// waiting Runs.
type poolState struct {
	key     informer.Key
	pods    []*podState
	rr      int
	waiting runHeap
	// due are waiting Runs whose Unschedulable condition is due, written
	// after the next scheduling pass if they are still waiting then and
	// the pool is still stuck.
	due []*runState
	// handedAt is when the pool last handed a slot to a Run (zero:
	// never); the pool is stuck from handedAt + UnschedulableAfter.
	handedAt time.Time
	// runtimeConfirmed: the store said the Runtime exists although the
	// informer did not have it yet.
	runtimeConfirmed bool
}

func (s *Scheduler) pool(k informer.Key) *poolState {
	p := s.pools[k]
	if p == nil {
		p = &poolState{key: k}
		s.pools[k] = p
	}
	return p
}

// stuckAt is when p counts as stuck if it hands out no slot until then.
func (s *Scheduler) stuckAt(p *poolState) time.Time {
	return p.handedAt.Add(s.cfg.UnschedulableAfter)
}

// afterPool makes the timer check p at t (or earlier, if it is armed
// earlier).
func (s *Scheduler) afterPool(p *poolState, t time.Time) {
	s.loop.After(t, loopKey{keyPool, p.key})
}

// checkStuck decides again the Runs of p that have waited
// UnschedulableAfter, if p is stuck now; otherwise it checks p again when
// it may be, as long as Runs wait in it.
func (s *Scheduler) checkStuck(ctx context.Context, p *poolState) {
	now := s.clk.Now()
	if at := s.stuckAt(p); now.Before(at) {
		if p.waiting.Len() > 0 {
			s.afterPool(p, at)
		}
		return
	}
	var overdue []*runState
	for _, rs := range p.waiting {
		if !now.Before(rs.since.Add(s.cfg.UnschedulableAfter)) {
			overdue = append(overdue, rs)
		}
	}
	for _, rs := range overdue {
		s.sync(ctx, rs.key)
	}
}

func (s *Scheduler) runtimeExists(p *poolState) bool {
	if p.runtimeConfirmed || len(p.pods) > 0 {
		return true
	}
	_, ok := s.cfg.RuntimeInformer.Get(p.key.Namespace, p.key.Name)
	return ok
}

// recheck decides every waiting Run of p again (its Runtime may be gone).
func (s *Scheduler) recheck(ctx context.Context, p *poolState) {
	waiting := append([]*runState(nil), p.waiting...)
	for _, rs := range waiting {
		s.sync(ctx, rs.key)
	}
}

// scheduleDirty gives free slots to waiting Runs in every pool whose
// capacity or queue changed, then writes the Unschedulable conditions that
// are due.
func (s *Scheduler) scheduleDirty(ctx context.Context) {
	for k := range s.dirty {
		delete(s.dirty, k)
		if p := s.pools[k]; p != nil {
			s.schedule(ctx, p)
		}
	}
}

func (s *Scheduler) schedule(ctx context.Context, p *poolState) {
	now := s.clk.Now()
	for _, ps := range p.pods {
		s.schedulePinned(ctx, p, ps, now)
	}
	for p.waiting.Len() > 0 {
		ps := s.pick(p)
		if ps == nil {
			break
		}
		rs := heap.Pop(&p.waiting).(*runState)
		s.waiting.Add(-1)
		s.hand(ctx, p, ps, rs, now)
	}
	if at := s.stuckAt(p); now.Before(at) && len(p.due) > 0 {
		// A slot was handed out meanwhile: the pool is draining after all.
		for _, rs := range p.due {
			rs.unschedQ = false
		}
		p.due = nil
		s.afterPool(p, at)
		return
	}
	for len(p.due) > 0 && s.unschedWriting < s.maxUnschedWriting() {
		rs := p.due[0]
		p.due = p.due[1:]
		rs.unschedQ = false
		if rs.index < 0 || rs.busy || s.runs[rs.key] != rs {
			continue
		}
		run, ok := s.get(rs.key)
		if !ok || run.ResourceVersion != rs.rv {
			continue
		}
		s.unwait(rs)
		s.unschedWriting++
		s.write(ctx, rs, run, job{kind: jobUnschedulable, message: s.unschedulableMessage(p)})
	}
}

// hand assigns rs, just taken out of its queue, to ps.
func (s *Scheduler) hand(ctx context.Context, p *poolState, ps *podState, rs *runState, now time.Time) {
	run, ok := s.get(rs.key)
	if !ok || run.ResourceVersion != rs.rv {
		return // a newer version is queued for sync
	}
	rs.reserved, rs.reservedBase = ps.pod.UID, run.ResourceVersion
	s.setSlot(rs, ps.pod.UID)
	p.handedAt = now
	s.write(ctx, rs, run, job{kind: jobAssign, pod: ps.pod})
}

// maxUnschedWriting leaves half the workers to assignments.
func (s *Scheduler) maxUnschedWriting() int {
	return max(1, s.cfg.Workers/2)
}

// pick returns the least-loaded ready pod of p with a free slot, or nil.
// Among equally loaded pods it takes turns.
func (s *Scheduler) pick(p *poolState) *podState {
	n := len(p.pods)
	var best *podState
	bestUsed := 0
	for i := range n {
		ps := p.pods[(p.rr+i)%n]
		u := s.used[ps.pod.UID]
		if u >= int(ps.pod.Slots) {
			continue
		}
		if best == nil || u < bestUsed {
			best, bestUsed = ps, u
		}
	}
	if best != nil {
		p.rr = (p.rr + 1) % n
	}
	return best
}

func (s *Scheduler) unschedulableMessage(p *poolState) string {
	if len(p.pods) == 0 {
		return fmt.Sprintf("runtime %s has no ready pod", p.key.Name)
	}
	return fmt.Sprintf("all %d ready pods of runtime %s are full and none has freed a slot for %v",
		len(p.pods), p.key.Name, max(s.cfg.UnschedulableAfter, 0))
}

func podPool(p podsource.Pod) informer.Key {
	ns := p.Namespace
	if ns == "" {
		ns = store.DefaultNamespace
	}
	return informer.Key{Namespace: ns, Name: p.Runtime}
}

func (s *Scheduler) podReady(p podsource.Pod) {
	k := podPool(p)
	if ps := s.pods[p.UID]; ps != nil {
		ps.pod = p // e.g. a changed slot count
		s.dirty[k] = struct{}{}
		return
	}
	ps := &podState{pod: p}
	s.pods[p.UID] = ps
	pl := s.pool(k)
	pl.pods = append(pl.pods, ps)
	s.dirty[k] = struct{}{}
	s.log.Debug("scheduler: pod ready", "pod", p.Name, "pod_uid", p.UID, "runtime", k.String(), "slots", p.Slots)
}

func (s *Scheduler) podGone(ctx context.Context, p podsource.Pod) {
	ps := s.pods[p.UID]
	if ps == nil {
		return
	}
	delete(s.pods, p.UID)
	if len(s.gone) >= maxGone {
		clear(s.gone)
	}
	s.gone[p.UID] = p.Name
	s.placedGone(ctx, p.UID)
	if q := s.pinned[p.UID]; q != nil {
		// Its pinned Runs can run nowhere else: decided again, they fail.
		for _, rs := range append([]*runState(nil), (*q)...) {
			s.sync(ctx, rs.key)
		}
	}
	k := podPool(ps.pod)
	pl := s.pool(k)
	for i, x := range pl.pods {
		if x == ps {
			pl.pods = append(pl.pods[:i:i], pl.pods[i+1:]...)
			break
		}
	}
	if len(pl.pods) == 0 {
		s.recheck(ctx, pl) // its Runtime may have been deleted
	}
}
