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
// decisions, as the loop's hooks. A Run created in the same process (a
// Function's replica) can be told of by Created, as its create returned
// it, and is then decided on that version until the informer shows it.
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
// A Run with spec.held waits in no queue: once it has been held
// UnschedulableAfter (so that `docker run`, a create and a start at once,
// costs no write), it gets phase Pending and condition Scheduled=False
// with reason Held, written once. It is decided again when the hold is
// cleared (spec.held true → false, one write: `docker
// start`). spec.cancelRequested still ends it Cancelled.
//
// A Run with spec.placement.podUID (pinned: a workflow job's step, which
// must find the files the job's earlier steps left on that pod) waits in
// its pod's own queue, not its pool's, and takes a slot only on that pod;
// a freed slot of a pod goes to its pinned Runs first, oldest first, then
// to its pool's queue. A Run pinned to a pod that is not among the ready
// pods of its Runtime (it went, or never was one: the scheduler starts
// once the pod source knows every live pod) ends Failed with reason
// Unschedulable, through the retry engine, and a message naming the pod.
// A pinned Run waiting for a slot of a live pod is not Unschedulable (the
// pod is alive: it waits its turn), but one that has waited
// UnschedulableAfter while its pod is full says so, once, with
// Scheduled=False and reason WaitingForPod naming the pod: a workflow
// step stuck behind another Run on its job's pod is not silent.
//
// Runs named to Defer (a workflow decision's step Runs, while they are
// being created) wait in no queue until the caller releases them, so that
// the first ones' placements and starts do not slow the creates of the
// rest; a hold lapses after 10 s.
//
// A conflicting write is never retried blindly: the Run is decided again
// from the informer once it shows the newer version.
package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/loop"
	"stoke.dev/stoke/internal/placement"
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
	ConditionScheduled = placement.ConditionScheduled
	// ReasonScheduled is the reason of Scheduled=True, and of
	// Retrying=False when an assignment ends the wait for a retry.
	ReasonScheduled = placement.ReasonScheduled
	// ReasonUnschedulable is the reason of Scheduled=False while no ready
	// pod of the Runtime has a free slot.
	ReasonUnschedulable = string(retry.Unschedulable)
	// ReasonWaitingForPod is the reason of Scheduled=False while a pinned
	// Run waits for a slot of its pod, which other Runs hold.
	ReasonWaitingForPod = "WaitingForPod"
	// ReasonHeld is the reason of Scheduled=False while spec.held keeps
	// the Run back (a Docker container created and not started).
	ReasonHeld = "Held"
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

	// hints are the Runs told of by Created, until the informer shows
	// them (created.go).
	hints hints
	// deferrals are the Runs held back by Defer (deferred.go).
	deferrals deferrals

	// loop is the mechanism: Run and Runtime keys from the informers,
	// Run and pool timers, pod events, the write workers.
	loop    *loop.Loop[loopKey, podsource.Event, result]
	started atomic.Bool
	// serving is set while the loop runs, so that Place has an answer;
	// done is closed when Run returns.
	serving atomic.Bool
	done    chan struct{}

	// placeReqs are the Place and Unplace calls for the loop (placed.go).
	placeMu   sync.Mutex
	placeReqs []placeReq

	// Owned by the Run goroutine.
	runs  map[informer.Key]*runState
	pods  map[string]*podState // ready pods by UID
	pools map[informer.Key]*poolState
	used  map[string]int // slots taken per pod UID, reservations included
	// pinned are the waiting Runs with spec.placement.podUID, by that
	// UID; only pods in pods have a queue here.
	pinned map[string]*runHeap
	// gone names the pods that went (by UID), for the message of a Run
	// pinned to one; forgotten in bulk past maxGone.
	gone  map[string]string
	dirty map[informer.Key]struct{}
	// unschedWriting is the number of Unschedulable writes in flight; at
	// most maxUnschedWriting, so that marking a long queue neither fills
	// the workers ahead of the assignments nor goes on once the pool hands
	// out a slot again.
	unschedWriting int
	seq            uint64
	// tickets are the slots Place reserved for Runs not seen yet, by the
	// Runs' names.
	tickets map[informer.Key]ticket
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
	keyPlace                  // Place and Unplace calls wait (placed.go)
	keyTicket                 // a reservation of Place may lapse
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
	s := &Scheduler{cfg: cfg, log: cfg.Logger, clk: cfg.Clock, done: make(chan struct{})}
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
	defer close(s.done)
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
	s.pinned = map[string]*runHeap{}
	s.gone = map[string]string{}
	s.dirty = map[informer.Key]struct{}{}
	s.tickets = map[informer.Key]ticket{}

	events, snapshot, cancel := s.cfg.Pods.Subscribe()
	defer cancel()
	for _, p := range snapshot {
		s.podReady(p)
	}
	addRun := func(r *v1alpha1.Run) {
		s.seen(r, false)
		s.loop.Add(loopKey{keyRun, informer.KeyOf(r)})
	}
	removeRuns := s.cfg.RunInformer.AddEventHandler(informer.HandlerFuncs[*v1alpha1.Run]{
		AddFunc:    addRun,
		UpdateFunc: func(_, r *v1alpha1.Run) { addRun(r) },
		DeleteFunc: func(r *v1alpha1.Run) {
			s.seen(r, true)
			s.loop.Add(loopKey{keyRun, informer.KeyOf(r)})
		},
	})
	defer removeRuns()
	removeRuntimes := s.cfg.RuntimeInformer.AddEventHandler(informer.HandlerFuncs[*v1alpha1.Runtime]{
		DeleteFunc: func(r *v1alpha1.Runtime) { s.loop.Add(loopKey{keyRuntime, informer.KeyOf(r)}) },
	})
	defer removeRuntimes()

	s.serving.Store(true)
	defer s.serving.Store(false)
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
	case keyPlace:
		s.servePlaces()
	case keyTicket:
		s.lapseTicket(k.Key)
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

// Waiting is the number of Runs waiting for a slot now (the queue depth,
// all Runtimes together). It is safe to call from any goroutine.
func (s *Scheduler) Waiting() int { return int(s.waiting.Load()) }
