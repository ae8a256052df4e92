// Package reaper is the stale-run reaper: it makes sure no Run stays
// non-terminal, or undeletable, because the pod it was assigned to is gone,
// and it deletes finished Runs whose spec.ttlSecondsAfterFinished has
// passed.
//
// Pods reach the reaper already fenced: the pool supervisor sends PodGone
// only after the pod's processes are dead, so nothing the pod ran can
// still write. On PodGone every non-terminal Run assigned to that pod UID
// goes through the retry engine with reason PodGone — whatever phase it
// was in (Scheduled, Running or Ready), because the cause is the pod;
// ExecutionLost is runtimed's reason for a live Runtime Server that forgot
// an execution. The engine retries it (Pending, attempt+1, assignment
// cleared, not before the backoff) or ends it (Failed, or Cancelled when
// cancel was requested). A write that conflicts is re-read from the store
// and decided again, so a Run another component finished meanwhile keeps
// its terminal status.
//
// After a restart of the whole process, whose pods all died with it,
// [Reaper.RecoverRestart] settles their Runs in the store before anything
// else starts: functions and not yet started tasks are requeued without
// spending an attempt, the rest go through the retry engine.
//
// A sweep at start (after the informer synced and the pod snapshot
// arrived) and every SweepInterval looks for Runs assigned to a UID that
// is not a live pod. A UID known to be gone is treated at once; an
// unknown UID after OrphanGrace, which covers a pod whose PodReady has not
// reached the reaper yet while the scheduler already assigned to it.
//
// A Run being deleted whose assigned pod is gone (or which has no pod)
// still carries runtimed's finalizer, [RuntimedFinalizer], that no runtimed
// will remove; the reaper removes it so the delete completes. So it does
// for a Run that no runtimed holds nor will, whatever its pod: one waiting
// for a pod (no phase, or Pending), or one that ended without a claim (no
// startTime). A Function's replica is created with the finalizer
// (internal/functionset), so that runtimed's path to Ready has no
// finalizer write; such a replica deleted before a runtimed claimed it is
// one of these.
//
// TTL: a Run that is terminal with a completionTime is deleted
// spec.ttlSecondsAfterFinished seconds after completionTime or, when the
// Run sets none, Config.FinishedRunTTL after it; a timer heap fed from the
// informer does it (no polling). The queue, the timers (Runs to look at
// again, TTLs, the sweep) and the pod events are internal/loop's; this
// package holds the decisions.
// Config.OnDeleted is called for every Run deletion the reaper observes,
// its own or anybody's, so the wiring can remove the working directory
// and logs.
package reaper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/loop"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/store"
)

// RuntimedFinalizer is the finalizer runtimed puts on the Runs it holds.
const RuntimedFinalizer = v1alpha1.FinalizerRuntimed

// Defaults.
const (
	DefaultSweepInterval = 10 * time.Second
	DefaultOrphanGrace   = 5 * time.Second
	// goneMemory is how long a gone pod's UID is remembered as gone
	// (rather than unknown).
	goneMemory = 10 * time.Minute
	// errorBackoff is the delay before a Run whose write failed is tried
	// again.
	errorBackoff = time.Second
)

// Pods is where the reaper learns of pod transitions.
type Pods = podsource.Source

// Config configures a Reaper.
type Config struct {
	// Runs is read on conflicts and written (status, finalizers, delete).
	Runs store.Resource[*v1alpha1.Run]
	// RunInformer is the shared Runs informer; the caller runs it.
	RunInformer *informer.Informer[*v1alpha1.Run]
	Pods        Pods
	// Clock defaults to the real clock.
	Clock clock.Clock
	// Logger: nil discards (internal/logging).
	Logger *slog.Logger
	// SweepInterval defaults to DefaultSweepInterval.
	SweepInterval time.Duration
	// OrphanGrace is how long a Run may stay assigned to a pod UID the
	// reaper has never heard of before it is treated as lost; zero means
	// DefaultOrphanGrace, negative means at once.
	OrphanGrace time.Duration
	// FinishedRunTTL is how long a finished Run whose spec sets no
	// ttlSecondsAfterFinished is kept; zero keeps it until deleted.
	FinishedRunTTL time.Duration
	// OnDeleted, when set, is called on the reaper's goroutine with the
	// last state of every Run whose deletion the reaper observes (TTL or
	// not). It may block briefly (it removes files).
	OnDeleted func(run *v1alpha1.Run)
}

// Reaper retries or fails the Runs of gone pods and deletes expired Runs.
type Reaper struct {
	cfg Config
	log *slog.Logger
	clk clock.Clock

	// loop is the mechanism: Run keys from the informer, the timers
	// (Runs to look at again, TTLs, the sweep), pod events.
	loop    *loop.Loop[loopKey, podsource.Event, struct{}]
	started atomic.Bool
	delMu   sync.Mutex
	dels    []*v1alpha1.Run // deletions seen by the handler, for OnDeleted

	// Owned by the Run goroutine.
	live    map[string]podsource.Pod
	gone    map[string]goneInfo
	orphans map[types.UID]time.Time // Run UID → first found on an unknown pod
	ttlAt   map[types.UID]time.Time // Run UID → when its TTL timer is due
}

// loopKey is a key of the reaper's loop.
type loopKey struct {
	kind keyKind
	informer.Key
	uid types.UID // keyTTL: the Run's UID
}

type keyKind uint8

const (
	keyRun     keyKind = iota // a Run: look at it
	keyDeleted                // Runs were deleted: tell OnDeleted
	keyTTL                    // a finished Run whose TTL may be up
	keySweep                  // the periodic sweep
)

func ttlKey(k informer.Key, uid types.UID) loopKey { return loopKey{kind: keyTTL, Key: k, uid: uid} }

// New checks cfg and returns a Reaper.
func New(cfg Config) (*Reaper, error) {
	switch {
	case cfg.Runs == nil:
		return nil, errors.New("reaper: Config.Runs is required")
	case cfg.RunInformer == nil:
		return nil, errors.New("reaper: Config.RunInformer is required")
	case cfg.Pods == nil:
		return nil, errors.New("reaper: Config.Pods is required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	cfg.Logger = logging.OrDiscard(cfg.Logger)
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = DefaultSweepInterval
	}
	if cfg.OrphanGrace == 0 {
		cfg.OrphanGrace = DefaultOrphanGrace
	}
	r := &Reaper{cfg: cfg, log: cfg.Logger, clk: cfg.Clock}
	r.loop = loop.New(loop.Config[loopKey, podsource.Event, struct{}]{
		Clock: cfg.Clock,
		Hooks: loop.Hooks[loopKey, podsource.Event, struct{}]{Sync: r.syncKey, Event: r.podEvent},
	})
	return r, nil
}

// Run waits for the informer to sync, subscribes to pods, sweeps, and then
// reacts to pods, Runs and timers until ctx ends; then it returns nil. It
// returns an error when the pod subscription ends before ctx does. Run may
// be called once.
func (r *Reaper) Run(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return errors.New("reaper: Run called twice")
	}
	if err := r.cfg.RunInformer.WaitForSync(ctx); err != nil {
		return nil
	}
	r.live = map[string]podsource.Pod{}
	r.gone = map[string]goneInfo{}
	r.orphans = map[types.UID]time.Time{}
	r.ttlAt = map[types.UID]time.Time{}

	events, snapshot, cancel := r.cfg.Pods.Subscribe()
	defer cancel()
	for _, p := range snapshot {
		r.live[p.UID] = p
	}
	addRun := func(run *v1alpha1.Run) { r.loop.Add(loopKey{kind: keyRun, Key: informer.KeyOf(run)}) }
	remove := r.cfg.RunInformer.AddEventHandler(informer.HandlerFuncs[*v1alpha1.Run]{
		AddFunc:    addRun,
		UpdateFunc: func(_, run *v1alpha1.Run) { addRun(run) },
		DeleteFunc: func(run *v1alpha1.Run) {
			r.delMu.Lock()
			r.dels = append(r.dels, run)
			r.delMu.Unlock()
			r.loop.Add(loopKey{kind: keyDeleted}) // before the Run's own key
			addRun(run)
		},
	})
	defer remove()
	// Pod events that arrived while subscribing count before the sweep.
	r.drainPods(ctx, events)
	r.sweep(ctx)

	if err := r.loop.Run(ctx, events); err != nil {
		if errors.Is(err, loop.ErrEventsEnded) {
			return errors.New("reaper: the pod subscription ended")
		}
		return fmt.Errorf("reaper: %w", err)
	}
	return nil
}

// syncKey is the loop's Sync hook.
func (r *Reaper) syncKey(ctx context.Context, k loopKey) {
	switch k.kind {
	case keyRun:
		r.sync(ctx, k.Key)
	case keyDeleted:
		r.delMu.Lock()
		dels := r.dels
		r.dels = nil
		r.delMu.Unlock()
		for _, run := range dels {
			r.deleted(run)
		}
	case keyTTL:
		if _, ok := r.ttlAt[k.uid]; !ok {
			return // dropped
		}
		delete(r.ttlAt, k.uid)
		r.expire(ctx, k.Key, k.uid)
	case keySweep:
		r.sweep(ctx)
	}
}

// sync looks at the informer's current state of one Run.
func (r *Reaper) sync(ctx context.Context, k informer.Key) {
	run, ok := r.cfg.RunInformer.Get(k.Namespace, k.Name)
	if !ok {
		return
	}
	r.trackTTL(run)
	r.check(ctx, run)
}

// deleted handles a Run deletion the informer saw.
func (r *Reaper) deleted(run *v1alpha1.Run) {
	delete(r.orphans, run.UID)
	delete(r.ttlAt, run.UID)
	r.loop.Stop(ttlKey(informer.KeyOf(run), run.UID))
	if r.cfg.OnDeleted != nil {
		r.cfg.OnDeleted(run)
	}
}
