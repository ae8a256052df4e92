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
// will remove; the reaper removes it so the delete completes.
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
	"slices"
	"sync"
	"sync/atomic"
	"time"

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

type goneInfo struct {
	pod    podsource.Pod
	reason string
	at     time.Time
}

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

// drainPods applies the pod events already waiting.
func (r *Reaper) drainPods(ctx context.Context, events <-chan podsource.Event) {
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return
			}
			r.podEvent(ctx, ev)
		default:
			return
		}
	}
}

func (r *Reaper) podEvent(ctx context.Context, ev podsource.Event) {
	switch ev.Type {
	case podsource.PodReady:
		r.live[ev.Pod.UID] = ev.Pod
	case podsource.PodGone:
		delete(r.live, ev.Pod.UID)
		r.gone[ev.Pod.UID] = goneInfo{pod: ev.Pod, reason: ev.Reason, at: r.clk.Now()}
		uid := ev.Pod.UID
		runs := r.cfg.RunInformer.List(func(run *v1alpha1.Run) bool { return run.Status.AssignedPodUID == uid })
		if len(runs) > 0 {
			r.log.Info("reaper: pod gone, recovering its runs", "pod", ev.Pod.Name, "pod_uid", uid, "reason", ev.Reason, "runs", len(runs))
		}
		for _, run := range runs {
			r.check(ctx, run)
		}
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

// podGone reports whether uid is not a live pod, and whether it is known
// to be gone (rather than never heard of).
func (r *Reaper) podGone(uid string) (notLive, knownGone bool) {
	if _, ok := r.live[uid]; ok {
		return false, false
	}
	_, known := r.gone[uid]
	return true, known
}

// check treats run if its pod is gone: it needs recovery when it is not
// terminal, or the removal of runtimed's finalizer when it is being
// deleted.
func (r *Reaper) check(ctx context.Context, run *v1alpha1.Run) {
	deleting := run.DeletionTimestamp != nil && slices.Contains(run.Finalizers, RuntimedFinalizer)
	assigned := run.Status.AssignedPodUID
	if !deleting && (run.Status.Phase.Terminal() || assigned == "") {
		delete(r.orphans, run.UID)
		return
	}
	if assigned != "" {
		notLive, known := r.podGone(assigned)
		if !notLive {
			delete(r.orphans, run.UID)
			return
		}
		if !known && r.cfg.OrphanGrace > 0 {
			now := r.clk.Now()
			first, seen := r.orphans[run.UID]
			if !seen {
				first = now
				r.orphans[run.UID] = now
			}
			if due := first.Add(r.cfg.OrphanGrace); now.Before(due) {
				r.loop.After(due, loopKey{kind: keyRun, Key: informer.KeyOf(run)})
				return
			}
		}
	}
	delete(r.orphans, run.UID)
	var err error
	if deleting {
		err = r.releaseFinalizer(ctx, run)
	} else {
		err = r.recover(ctx, run, r.goneMessage)
	}
	if err != nil && ctx.Err() == nil {
		r.log.Warn("reaper: write failed, will try again", "run", informer.KeyOf(run).String(), "run_uid", run.UID, "error", err)
		r.loop.After(r.clk.Now().Add(errorBackoff), loopKey{kind: keyRun, Key: informer.KeyOf(run)})
	}
}

// recover sends run, assigned to a pod that is gone, through the retry
// engine. On a conflict it re-reads the Run and decides again; it writes
// nothing once the Run is terminal or assigned elsewhere.
func (r *Reaper) recover(ctx context.Context, run *v1alpha1.Run, message func(*v1alpha1.Run) string) error {
	err := r.settleAssigned(ctx, run, func(run *v1alpha1.Run) (*v1alpha1.Run, func(*v1alpha1.Run)) {
		d := retry.Decide(run, retry.PodGone, message(run), r.clk.Now())
		next := run.DeepCopy()
		retry.Apply(next, d)
		return next, func(stored *v1alpha1.Run) {
			r.log.Info("reaper: recovered run of a gone pod", "run", informer.KeyOf(run).String(), "run_uid", run.UID,
				"pod_uid", run.Status.AssignedPodUID, "phase", stored.Status.Phase, "attempt", stored.Status.Attempt, "retry", d.Retry)
		}
	})
	if err != nil {
		return fmt.Errorf("recover run %s: %w", informer.KeyOf(run), err)
	}
	return nil
}

// settleAssigned writes the status that change returns for run, still assigned
// to the pod it is assigned to now, and logs with the returned func on
// success. On a conflict it re-reads the Run and asks change again; it
// writes nothing once the Run is terminal, assigned elsewhere, being
// deleted or gone, or when change returns nil.
func (r *Reaper) settleAssigned(ctx context.Context, run *v1alpha1.Run,
	change func(run *v1alpha1.Run) (next *v1alpha1.Run, logged func(stored *v1alpha1.Run))) error {
	uid := run.Status.AssignedPodUID
	return store.RetryOnConflict(func() error {
		if run.Status.Phase.Terminal() || run.Status.AssignedPodUID != uid || run.DeletionTimestamp != nil {
			return nil
		}
		next, logged := change(run)
		if next == nil {
			return nil
		}
		stored, err := r.cfg.Runs.UpdateStatus(ctx, next)
		if err == nil {
			logged(stored)
			return nil
		}
		fresh, rerr := r.reread(ctx, run, err)
		if fresh == nil {
			return rerr
		}
		run = fresh
		return err // the conflict: decide again
	})
}

// releaseFinalizer removes runtimed's finalizer from a Run being deleted
// whose pod is gone, so the deletion can complete.
func (r *Reaper) releaseFinalizer(ctx context.Context, run *v1alpha1.Run) error {
	uid := run.Status.AssignedPodUID
	err := store.RetryOnConflict(func() error {
		if !slices.Contains(run.Finalizers, RuntimedFinalizer) || run.Status.AssignedPodUID != uid {
			return nil
		}
		next := run.DeepCopy()
		next.Finalizers = slices.DeleteFunc(next.Finalizers, func(f string) bool { return f == RuntimedFinalizer })
		_, err := r.cfg.Runs.Update(ctx, next)
		if err == nil {
			r.log.Info("reaper: released the finalizer of a deleted run whose pod is gone", "run", informer.KeyOf(run).String(), "run_uid", run.UID, "pod_uid", uid)
			return nil
		}
		fresh, rerr := r.reread(ctx, run, err)
		if fresh == nil {
			return rerr
		}
		run = fresh
		return err // the conflict: decide again
	})
	if err != nil {
		return fmt.Errorf("release finalizer of run %s: %w", informer.KeyOf(run), err)
	}
	return nil
}

// reread handles a failed write of run: on a conflict it returns the
// stored Run (same UID) to decide again; otherwise, or when the Run is
// gone, nil with the error to report (nil when there is nothing left to
// do).
func (r *Reaper) reread(ctx context.Context, run *v1alpha1.Run, err error) (*v1alpha1.Run, error) {
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, nil
	}
	if !errors.Is(err, errdefs.ErrConflict) {
		return nil, err
	}
	fresh, gerr := r.cfg.Runs.Get(ctx, run.Namespace, run.Name)
	if errors.Is(gerr, errdefs.ErrNotFound) {
		return nil, nil
	}
	if gerr != nil {
		return nil, gerr
	}
	if fresh.UID != run.UID {
		return nil, nil
	}
	return fresh, nil
}

func (r *Reaper) goneMessage(run *v1alpha1.Run) string {
	uid := run.Status.AssignedPodUID
	if g, ok := r.gone[uid]; ok {
		reason := g.reason
		if reason == "" {
			reason = "gone"
		}
		return fmt.Sprintf("pod %s (uid %s) is gone (%s) while the run was %s", g.pod.Name, uid, reason, phaseName(run.Status.Phase))
	}
	return fmt.Sprintf("pod %s (uid %s) is not a live pod while the run was %s", run.Status.AssignedPod, uid, phaseName(run.Status.Phase))
}

func phaseName(p v1alpha1.Phase) string {
	if p == "" {
		return string(v1alpha1.PhasePending)
	}
	return string(p)
}

// sweep checks every Run against the live pods and forgets old gone UIDs.
func (r *Reaper) sweep(ctx context.Context) {
	now := r.clk.Now()
	r.loop.Set(now.Add(r.cfg.SweepInterval), loopKey{kind: keySweep})
	for uid, g := range r.gone {
		if now.Sub(g.at) > goneMemory {
			delete(r.gone, uid)
		}
	}
	runs := r.cfg.RunInformer.List(func(run *v1alpha1.Run) bool {
		return run.Status.AssignedPodUID != "" || run.DeletionTimestamp != nil
	})
	for _, run := range runs {
		r.check(ctx, run)
	}
}

// ttlDeadline returns when run is to be deleted, if it is: its own TTL
// wins over the server's.
func (r *Reaper) ttlDeadline(run *v1alpha1.Run) (time.Time, bool) {
	st := run.Status
	if !st.Phase.Terminal() || st.CompletionTime == nil || run.DeletionTimestamp != nil {
		return time.Time{}, false
	}
	if ttl := run.Spec.TTLSecondsAfterFinished; ttl != nil {
		return st.CompletionTime.Add(time.Duration(*ttl) * time.Second), true
	}
	if r.cfg.FinishedRunTTL > 0 {
		return st.CompletionTime.Add(r.cfg.FinishedRunTTL), true
	}
	return time.Time{}, false
}

// trackTTL keeps run's entry in the TTL heap current.
func (r *Reaper) trackTTL(run *v1alpha1.Run) {
	at, ok := r.ttlDeadline(run)
	old, had := r.ttlAt[run.UID]
	k := ttlKey(informer.KeyOf(run), run.UID)
	switch {
	case !ok:
		if had {
			delete(r.ttlAt, run.UID)
			r.loop.Stop(k)
		}
	case !had || !old.Equal(at):
		r.ttlAt[run.UID] = at
		r.loop.Set(at, k)
	}
}

// expire deletes a Run whose TTL passed, if the informer agrees.
func (r *Reaper) expire(ctx context.Context, key informer.Key, uid types.UID) {
	run, ok := r.cfg.RunInformer.Get(key.Namespace, key.Name)
	if !ok || run.UID != uid {
		return
	}
	if at, ok := r.ttlDeadline(run); !ok || at.After(r.clk.Now()) {
		r.trackTTL(run)
		return
	}
	err := r.cfg.Runs.Delete(ctx, key.Namespace, key.Name, store.DeleteOptions{Preconditions: store.Preconditions{UID: string(uid)}})
	switch {
	case err == nil:
		r.log.Info("reaper: deleted finished run after its TTL", "run", key.String(), "run_uid", uid)
	case errors.Is(err, errdefs.ErrNotFound), errors.Is(err, errdefs.ErrConflict):
	case ctx.Err() != nil:
	default:
		r.log.Warn("reaper: TTL delete failed, will try again", "run", key.String(), "run_uid", uid, "error", err)
		at := r.clk.Now().Add(errorBackoff)
		r.ttlAt[uid] = at
		r.loop.Set(at, ttlKey(key, uid))
	}
}
