// Package scheduler assigns Pending Runs to ready runtime pods with a free
// slot.
//
// The scheduler is event-driven: it hears about Runs from the shared Runs
// informer, about pods from the pool supervisor's subscription, and about
// time (retry backoff, the Unschedulable condition) from one timer; there
// is no polling loop. All decisions are made on one goroutine over
// in-memory state, and status writes go to a few worker goroutines so that
// deciding never waits for the store. That mechanism (key queue, timer
// heap, write workers) is internal/loop's; this package holds the
// decisions, as the loop's hooks.
//
// Capacity is derived from the Runs, never counted separately: the slots
// used on a pod are the Runs in the informer cache whose
// status.assignedPodUID is the pod's UID and whose phase holds a slot
// (Scheduled, Running, Ready), plus the assignments this scheduler has
// written but the informer has not shown yet (an optimistic reservation,
// so that a burst of Pending Runs cannot over-assign a pod before the
// informer catches up). The per-pod count is kept up to date from each
// Run's previous and current state, so a decision costs O(pods of the
// Runtime), not a scan of Runs.
//
// For each Run with an empty phase (just created) or Pending:
//
//   - spec.cancelRequested ends it as Cancelled through the retry engine;
//   - a Run waiting for a retry (retry.NotBefore) is left alone until then,
//     by a timer;
//   - a Run whose Runtime does not exist (not in the Runtimes informer, no
//     pods, and a store read confirms it) ends Failed with reason
//     RuntimeNotFound, through the retry engine (so a policy that lists
//     RuntimeNotFound retries it with backoff);
//   - otherwise it waits in its Runtime's queue, oldest creationTimestamp
//     first, and gets the least-loaded ready pod of that Runtime (same
//     namespace) with a free slot, ties broken round-robin. The assignment
//     is one UpdateStatus: phase Scheduled, assignedPod, assignedPodUID,
//     attempt at least 1, condition Scheduled=True, and Retrying=False when
//     present.
//
// A slot freed by a Run leaving a slot-holding phase, or a pod becoming
// ready, hands the slot to the oldest waiting Run of that Runtime at once.
//
// A waiting Run gets phase Pending and condition Scheduled=False with reason
// Unschedulable, written once, when it has waited UnschedulableAfter and
// its Runtime's pool is stuck: it has handed no slot to any Run for
// UnschedulableAfter either (no ready pod, or every ready pod full with
// nothing finishing). A Run queued behind others in a pool that is
// draining is only waiting its turn, so it gets no such write: under load
// that write would be one more API write per Run, for nothing. The Runs of
// a burst that a pod takes a moment later get none either. A pool that gets
// stuck later still gets its waiting Runs marked: a timer per pool checks
// it UnschedulableAfter after the last slot it handed. The marking takes at
// most half the write workers, so assignments never queue behind it, and
// it stops as soon as the pool hands out a slot again (a pause of a loaded
// machine marks a few Runs, not the whole queue).
//
// A conflicting write is never retried blindly: the Run is decided again
// from the informer once it shows the newer version.
package scheduler

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/loop"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/retry"
	"stoke.dev/stoke/internal/store"
)

// RuntimeNotFound is the failure reason of a Run whose spec.runtime names
// no Runtime in its namespace. The retry engine does not retry it unless
// spec.retryPolicy.retryableReasons lists it.
const RuntimeNotFound retry.Reason = "RuntimeNotFound"

// Condition types and reasons the scheduler writes.
const (
	// ConditionScheduled is True once the Run is assigned to a pod, False
	// with reason Unschedulable while no pod can take it.
	ConditionScheduled = "Scheduled"
	// ReasonScheduled is the reason of Scheduled=True, and of
	// Retrying=False when an assignment ends the wait for a retry.
	ReasonScheduled = "Scheduled"
	// ReasonUnschedulable is the reason of Scheduled=False while no ready
	// pod of the Runtime has a free slot.
	ReasonUnschedulable = string(retry.Unschedulable)
)

// Default tunables.
const (
	// DefaultUnschedulableAfter is how long a Run may wait for a slot,
	// with its pool handing none out, before the Unschedulable condition
	// is written.
	DefaultUnschedulableAfter = time.Second
	// DefaultWorkers is the number of concurrent status writes.
	DefaultWorkers = 4
	// errorBackoff is how long a Run whose write failed (other than by a
	// conflict) waits before it is decided again.
	errorBackoff = time.Second
)

// Pods is where the scheduler learns of pod transitions.
type Pods = podsource.Source

// Config configures a Scheduler.
type Config struct {
	// Runs is where assignments and scheduler-decided endings are written.
	Runs store.StatusWriter[*v1alpha1.Run]
	// RunInformer is the shared Runs informer; the caller runs it.
	RunInformer *informer.Informer[*v1alpha1.Run]
	// Runtimes is read to confirm that a Runtime the informer does not
	// have is really missing before its Runs are failed.
	Runtimes store.Reader[*v1alpha1.Runtime]
	// RuntimeInformer is the shared Runtimes informer; the caller runs it.
	RuntimeInformer *informer.Informer[*v1alpha1.Runtime]
	// Pods is the pool supervisor.
	Pods Pods
	// Clock defaults to the real clock.
	Clock clock.Clock
	// Logger: nil discards (internal/logging).
	Logger *slog.Logger
	// OnScheduled, when set, is called after each assignment is stored,
	// with the Run as stored and the scheduling latency: the time from
	// when the scheduler first saw this attempt of the Run waiting (for a
	// new Run, its creation, as delivered by the watch; for a retry, the
	// end of its backoff or when it became Pending, whichever is later)
	// to the stored assignment. creationTimestamp has whole-second
	// precision, so it is not used. It is called from the scheduler's
	// write goroutines: it must be fast and safe for concurrent use. This
	// is the hook for the metrics layer.
	OnScheduled func(run *v1alpha1.Run, latency time.Duration)
	// OnUnschedulable, when set, is called after each Unschedulable
	// condition is stored, and OnConflict after each assignment the store
	// refused because the Run had changed (a reservation conflict: the Run
	// is decided again from the newer version). Both are called from the
	// write goroutines, like OnScheduled: metrics hooks.
	OnUnschedulable func(run *v1alpha1.Run)
	OnConflict      func(run *v1alpha1.Run)
	// UnschedulableAfter is how long a Run waits for a slot, and its pool
	// hands no slot to any Run, before the Scheduled=False/Unschedulable
	// condition (and phase Pending) is written; zero means
	// DefaultUnschedulableAfter, negative means at once.
	UnschedulableAfter time.Duration
	// Workers is the number of concurrent status writes; zero means
	// DefaultWorkers.
	Workers int
}

// Scheduler assigns Pending Runs to pods. Create it with New; Run drives it.
type Scheduler struct {
	cfg Config
	log *slog.Logger
	clk clock.Clock

	// waiting is the number of Runs in the pools' queues, for Waiting.
	waiting atomic.Int64

	// loop is the mechanism: Run and Runtime keys from the informers,
	// Run and pool timers, pod events, the write workers.
	loop    *loop.Loop[loopKey, podsource.Event, result]
	started atomic.Bool

	// Owned by the Run goroutine.
	runs  map[informer.Key]*runState
	pods  map[string]*podState // ready pods by UID
	pools map[informer.Key]*poolState
	used  map[string]int // slots taken per pod UID, reservations included
	dirty map[informer.Key]struct{}
	// unschedWriting is the number of Unschedulable writes in flight; at
	// most maxUnschedWriting, so that marking a long queue neither fills
	// the workers ahead of the assignments nor goes on once the pool hands
	// out a slot again.
	unschedWriting int
	seq            uint64
}

// loopKey is a key of the scheduler's loop: a Run, or a Runtime that was
// deleted (queued), or a pool whose stuck check is due (timer). The kind
// keeps apart a Run and a Runtime that share a name.
type loopKey struct {
	kind keyKind
	informer.Key
}

type keyKind uint8

const (
	keyRun     keyKind = iota // a Run: sync it
	keyRuntime                // a deleted Runtime: recheck its pool
	keyPool                   // a pool (namespace, Runtime name): is it stuck?
)

// New checks cfg and returns a Scheduler.
func New(cfg Config) (*Scheduler, error) {
	switch {
	case cfg.Runs == nil:
		return nil, errors.New("scheduler: Config.Runs is required")
	case cfg.RunInformer == nil:
		return nil, errors.New("scheduler: Config.RunInformer is required")
	case cfg.Runtimes == nil:
		return nil, errors.New("scheduler: Config.Runtimes is required")
	case cfg.RuntimeInformer == nil:
		return nil, errors.New("scheduler: Config.RuntimeInformer is required")
	case cfg.Pods == nil:
		return nil, errors.New("scheduler: Config.Pods is required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	cfg.Logger = logging.OrDiscard(cfg.Logger)
	if cfg.UnschedulableAfter == 0 {
		cfg.UnschedulableAfter = DefaultUnschedulableAfter
	}
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	s := &Scheduler{cfg: cfg, log: cfg.Logger, clk: cfg.Clock}
	s.loop = loop.New(loop.Config[loopKey, podsource.Event, result]{
		Clock:   cfg.Clock,
		Workers: cfg.Workers,
		Hooks: loop.Hooks[loopKey, podsource.Event, result]{
			Sync:   s.syncKey,
			Event:  s.podEvent,
			Result: s.handleResult,
			Settle: s.scheduleDirty,
		},
	})
	return s, nil
}

// Run waits for the informers to sync, subscribes to pods and schedules
// until ctx ends; then it waits for its writes to finish and returns nil.
// It returns an error when the pod subscription ends before ctx does. Run
// may be called once.
func (s *Scheduler) Run(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("scheduler: Run called twice")
	}
	if err := s.cfg.RunInformer.WaitForSync(ctx); err != nil {
		return nil
	}
	if err := s.cfg.RuntimeInformer.WaitForSync(ctx); err != nil {
		return nil
	}
	s.runs = map[informer.Key]*runState{}
	s.pods = map[string]*podState{}
	s.pools = map[informer.Key]*poolState{}
	s.used = map[string]int{}
	s.dirty = map[informer.Key]struct{}{}

	events, snapshot, cancel := s.cfg.Pods.Subscribe()
	defer cancel()
	for _, p := range snapshot {
		s.podReady(p)
	}
	addRun := func(r *v1alpha1.Run) { s.loop.Add(loopKey{keyRun, informer.KeyOf(r)}) }
	removeRuns := s.cfg.RunInformer.AddEventHandler(informer.HandlerFuncs[*v1alpha1.Run]{
		AddFunc:    addRun,
		UpdateFunc: func(_, r *v1alpha1.Run) { addRun(r) },
		DeleteFunc: addRun,
	})
	defer removeRuns()
	removeRuntimes := s.cfg.RuntimeInformer.AddEventHandler(informer.HandlerFuncs[*v1alpha1.Runtime]{
		DeleteFunc: func(r *v1alpha1.Runtime) { s.loop.Add(loopKey{keyRuntime, informer.KeyOf(r)}) },
	})
	defer removeRuntimes()

	if err := s.loop.Run(ctx, events); err != nil {
		if errors.Is(err, loop.ErrEventsEnded) {
			return errors.New("scheduler: the pod subscription ended")
		}
		return fmt.Errorf("scheduler: %w", err)
	}
	return nil
}

// syncKey is the loop's Sync hook: a Run to decide, a deleted Runtime
// whose waiting Runs to decide again, or a pool whose stuck check is due.
func (s *Scheduler) syncKey(ctx context.Context, k loopKey) {
	switch k.kind {
	case keyRun:
		s.sync(ctx, k.Key)
	case keyRuntime:
		if p := s.pools[k.Key]; p != nil {
			p.runtimeConfirmed = false
			s.recheck(ctx, p)
		}
	case keyPool:
		if p := s.pools[k.Key]; p != nil {
			s.checkStuck(ctx, p)
		}
	}
}

// podEvent is the loop's Event hook.
func (s *Scheduler) podEvent(ctx context.Context, ev podsource.Event) {
	switch ev.Type {
	case podsource.PodReady:
		s.podReady(ev.Pod)
	case podsource.PodGone:
		s.podGone(ctx, ev.Pod)
	}
}

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

	index    int       // position in its pool's waiting heap; -1 when not waiting
	since    time.Time // when this attempt was first seen waiting
	unschedQ bool      // queued in its pool's due list
}

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

func poolOf(run *v1alpha1.Run) informer.Key {
	return informer.Key{Namespace: informer.KeyOf(run).Namespace, Name: run.Spec.Runtime}
}

// sync brings the state of one Run in line with the informer's copy and
// decides what to do with it.
func (s *Scheduler) sync(ctx context.Context, k informer.Key) {
	run, ok := s.cfg.RunInformer.Get(k.Namespace, k.Name)
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
	if nb, ok := retry.NotBefore(run); ok && now.Before(nb) {
		s.unwait(rs)
		rs.since = time.Time{}
		s.after(rs, nb)
		return
	}
	if rs.since.IsZero() {
		rs.since = now
	}
	p := s.pool(rs.pool)
	if !s.runtimeExists(p) {
		s.unwait(rs)
		s.write(ctx, rs, run, job{kind: jobRuntimeCheck})
		return
	}
	if rs.index < 0 {
		heap.Push(&p.waiting, rs)
		s.waiting.Add(1)
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

// unschedulableWritten reports whether run already says it is
// unschedulable.
func unschedulableWritten(run *v1alpha1.Run) bool {
	if run.Status.Phase != v1alpha1.PhasePending {
		return false
	}
	c := meta.FindStatusCondition(run.Status.Conditions, ConditionScheduled)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == ReasonUnschedulable
}

func (s *Scheduler) runtimeExists(p *poolState) bool {
	if p.runtimeConfirmed || len(p.pods) > 0 {
		return true
	}
	_, ok := s.cfg.RuntimeInformer.Get(p.key.Namespace, p.key.Name)
	return ok
}

// unwait takes rs out of its pool's queue.
func (s *Scheduler) unwait(rs *runState) {
	if rs.index >= 0 {
		heap.Remove(&s.pools[rs.pool].waiting, rs.index)
		s.waiting.Add(-1)
	}
}

// Waiting is the number of Runs waiting for a slot now (the queue depth,
// all Runtimes together). It is safe to call from any goroutine.
func (s *Scheduler) Waiting() int { return int(s.waiting.Load()) }

// after makes the timer sync rs at t (or earlier, if it is armed
// earlier).
func (s *Scheduler) after(rs *runState, t time.Time) {
	s.loop.After(t, loopKey{keyRun, rs.key})
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
	for p.waiting.Len() > 0 {
		ps := s.pick(p)
		if ps == nil {
			break
		}
		rs := heap.Pop(&p.waiting).(*runState)
		s.waiting.Add(-1)
		run, ok := s.cfg.RunInformer.Get(rs.key.Namespace, rs.key.Name)
		if !ok || run.ResourceVersion != rs.rv {
			continue // a newer version is queued for sync
		}
		rs.reserved, rs.reservedBase = ps.pod.UID, run.ResourceVersion
		s.setSlot(rs, ps.pod.UID)
		p.handedAt = now
		s.write(ctx, rs, run, job{kind: jobAssign, pod: ps.pod})
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
		run, ok := s.cfg.RunInformer.Get(rs.key.Namespace, rs.key.Name)
		if !ok || run.ResourceVersion != rs.rv {
			continue
		}
		s.unwait(rs)
		s.unschedWriting++
		s.write(ctx, rs, run, job{kind: jobUnschedulable, message: s.unschedulableMessage(p)})
	}
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

// write hands a status write for rs to the workers.
func (s *Scheduler) write(ctx context.Context, rs *runState, run *v1alpha1.Run, j job) {
	rs.busy = true
	j.rs, j.run, j.since = rs, run, rs.since
	s.loop.Submit(ctx, func(ctx context.Context) result { return s.do(ctx, j) })
}

// handleResult takes a finished write back into the state.
func (s *Scheduler) handleResult(ctx context.Context, r result) {
	rs := r.rs
	if r.kind == jobUnschedulable {
		s.unschedWriting--
		for k, p := range s.pools { // the marking goes on where it waited
			if len(p.due) > 0 {
				s.dirty[k] = struct{}{}
			}
		}
	}
	if s.runs[rs.key] != rs {
		return // ended or replaced meanwhile
	}
	rs.busy = false
	base := r.run.ResourceVersion
	switch {
	case r.err == nil && r.kind == jobRuntimeCheck && r.stored == nil:
		// The Runtime exists; the informer has not caught up.
		s.pool(rs.pool).runtimeConfirmed = true
	case r.err == nil:
		if r.stored.ResourceVersion == base {
			// Nothing changed, so no event will come.
			break
		}
		if r.kind == jobAssign {
			s.log.Debug("scheduler: assigned", "run", rs.key.String(), "run_uid", rs.uid, "pod", r.pod.Name)
		}
		if rs.rv == base {
			rs.holdRV = base // decide again once the informer shows the write
		}
	case errors.Is(r.err, errdefs.ErrConflict) || errors.Is(r.err, errdefs.ErrNotFound):
		if rs.rv == base {
			rs.holdRV = base
		}
	case ctx.Err() != nil:
		return
	default:
		s.log.Warn("scheduler: status write failed", "run", rs.key.String(), "run_uid", rs.uid, "error", r.err)
		rs.retryAt = s.clk.Now().Add(errorBackoff)
	}
	if r.err != nil && rs.reserved != "" && rs.reservedBase == base {
		rs.reserved, rs.reservedBase = "", ""
	}
	s.sync(ctx, rs.key)
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
