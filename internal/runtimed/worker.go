package runtimed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/placement"
	"stoke.dev/stoke/internal/retry"
	"stoke.dev/stoke/internal/runtime"
)

// worker drives one Run on this pod.
type worker struct {
	d      *Daemon
	uid    string
	log    *slog.Logger
	cancel context.CancelFunc

	mu      sync.Mutex
	latest  *v1alpha1.Run
	deleted bool
	updates chan struct{} // signalled when latest changes
	// executing is closed once a task's execution was started on the
	// Runtime Server, so that an exec can wait for it.
	executing chan struct{}
	// adopted is set for a Run a previous runtimed claimed (Adopt).
	adopted bool
	// taken is when this runtimed took the Run (the dispatch latency's
	// start).
	taken time.Time
	// registered is when a function's registration was known Ready
	// (logged with Ready).
	registered time.Time
	// dir is the Run's working directory, once known (hidePaths).
	dir string
	// claimAt, when set, is when this runtimed took a task whose claim is
	// deferred (deferClaim): its startTime, written with Running once
	// the task has run Config.RunningAfter, or with its end.
	claimAt metav1.Time
}

func (w *worker) update(run *v1alpha1.Run) {
	w.mu.Lock()
	w.latest = run
	w.mu.Unlock()
	w.signal()
}

// updateUnclaimed is update for a version of a Run placed at its create
// and not written yet (OnPlaced): taken only while the worker knows
// nothing newer than such a version.
func (w *worker) updateUnclaimed(run *v1alpha1.Run) {
	w.mu.Lock()
	newer := placement.Unclaimed(w.latest) != ""
	if newer {
		w.latest = run
	}
	w.mu.Unlock()
	if newer {
		w.signal()
	}
}

// wrote records what the worker's own write of base stored, unless the
// informer handed over another version while the write was in flight:
// that one is the stored version itself or a later one (a delete, a
// cancel), and overwriting it would lose that change for good, as no
// further event brings it back. Versions are compared for equality only;
// Kubernetes keeps them opaque.
func (w *worker) wrote(base, stored *v1alpha1.Run) {
	w.mu.Lock()
	if w.latest.ResourceVersion == base.ResourceVersion {
		w.latest = stored
	}
	w.mu.Unlock()
	w.signal()
}

func (w *worker) signal() {
	select {
	case w.updates <- struct{}{}:
	default:
	}
}

// markDeleted hands the worker the Run's last state, gone for good; under
// w.mu, as current reads it.
func (w *worker) markDeleted(run *v1alpha1.Run) {
	w.mu.Lock()
	w.deleted = true
	w.mu.Unlock()
	w.update(run)
}

func (w *worker) current() (*v1alpha1.Run, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.latest, w.deleted
}

// stopRequested reports whether the Run is being cancelled or deleted.
func (w *worker) stopRequested() (cancel, deleted bool) {
	run, gone := w.current()
	return run.Spec.CancelRequested, gone || run.DeletionTimestamp != nil
}

func (w *worker) run(ctx context.Context) {
	if w.adopted {
		// Claimed and materialised by the previous runtimed; its
		// execution or registration may still be on the Runtime Server.
		run, _ := w.current()
		dir, shared, err := w.d.workDir(run)
		if err != nil {
			w.fail(ctx, retry.InvalidSpec, err.Error())
			return
		}
		w.dir = dir
		defer w.removeDir(ctx, run, dir, shared)
		w.log.Info("adopting a run claimed by the previous runtimed", "phase", run.Status.Phase)
		if run.Spec.Mode.Function != nil {
			w.runFunction(ctx, run, dir, nil, nil)
			return
		}
		w.runTask(ctx, run, dir)
		return
	}
	now := metav1.NewTime(w.d.cfg.Now())
	run, _ := w.current()
	// The directory is known before the claim goes (status writes hide
	// its path).
	dir, shared, dirErr := w.d.workDir(run)
	if dirErr == nil {
		w.dir = dir
	}
	if w.deferClaim(run, shared, dirErr) {
		if w.d.wasTaken(w.uid, dir, shared) {
			// A previous runtimed of this pod took this Run (it made
			// its directory, or its mark in a shared workspace) and
			// stopped before writing it Running: its execution may
			// have started, so it is adopted, never started again.
			w.adopted = true
			defer w.removeDir(ctx, run, dir, shared)
			w.log.Info("adopting an unclaimed task the previous runtimed took")
			w.runTask(ctx, run, dir)
			return
		}
		if !shared {
			w.claimAt = now // its directory, made below, is the mark
		} else if err := w.d.markTaken(w.uid); err != nil {
			w.log.Warn("marking a task in a shared workspace taken: claiming it first", "error", err)
		} else {
			w.claimAt = now
		}
	}
	// A function's source is materialised and its registration started
	// while the claim is on its way (one API round trip less before
	// Ready, which a scale from zero waits for): a registration only
	// loads the handler, no invocation reaches it before Ready, and
	// runFunction writes nothing (Ready, failed, the finalizer) until the
	// claim landed, unregistering it when the claim was refused. A task
	// starts only once claimed, unless its claim is deferred
	// (deferClaim).
	var claimed chan *v1alpha1.Run
	var rc *readyClaim
	switch {
	case !w.claimAt.IsZero():
	case run.Spec.Mode.Function != nil && dirErr == nil && w.holdClaim(run):
		// The claim waits for the registration, to go with Ready.
		claimed = make(chan *v1alpha1.Run, 1)
		rc = w.newReadyClaim(ctx, now, claimed)
		defer rc.take() // the bound sends nothing once the worker is done
	case run.Spec.Mode.Function != nil && dirErr == nil:
		claimed = make(chan *v1alpha1.Run, 1)
		go func() { claimed <- w.claim(ctx, now) }()
	default:
		if run = w.claim(ctx, now); run == nil {
			return
		}
	}
	if dirErr != nil {
		w.fail(ctx, retry.InvalidSpec, dirErr.Error())
		return
	}
	defer w.removeDir(ctx, run, dir, shared)
	if err := materialise(ctx, w.d.cfg.WorkDirs, dir, shared, run.Spec.Source, w.gitTree(run), w.d.spares); err != nil {
		if ctx.Err() != nil {
			return
		}
		reason := retry.InvalidSpec
		if errors.Is(err, errGitFetch) {
			reason = retry.SourceFetchFailed
		}
		if rc != nil {
			rc.send()
		}
		if claimed != nil && <-claimed == nil {
			return
		}
		w.fail(ctx, reason, fmt.Sprintf("materialising source: %v", err))
		return
	}
	if claimed != nil {
		w.runFunction(ctx, run, dir, claimed, rc)
		return
	}
	w.runTask(ctx, run, dir)
}

// claim writes the Run Running (Scheduled → Running, with startTime) and
// returns what was stored, or nil when the Run moved on (cancelled,
// reassigned, ended) or the write failed. A conflict re-reads and decides
// again. A function requeued after a restart keeps its first startTime:
// its reservation lifetime counts from there (a retry clears it). A Run
// placed here at its create and not written yet is assigned in the same
// write.
func (w *worker) claim(ctx context.Context, now metav1.Time) *v1alpha1.Run {
	claimed, err := w.setStatus(ctx, func(r *v1alpha1.Run) bool {
		if !w.assigned(r, now) {
			return false
		}
		setClaimed(r, now)
		return true
	})
	if err != nil && ctx.Err() == nil {
		w.log.Warn("claiming run", "error", err)
	}
	return claimed
}

// assigned reports whether r is Scheduled on this pod, assigning it here
// first when it was placed here at its create and nothing was written
// since (placement.Unclaimed): the write of its claim is then its
// assignment too.
func (w *worker) assigned(r *v1alpha1.Run, now metav1.Time) bool {
	if r.Status.Phase == v1alpha1.PhaseScheduled {
		return true
	}
	if placement.Unclaimed(r) != w.d.cfg.Pod.UID {
		return false
	}
	placement.Assign(r, w.d.cfg.Pod.Name, w.d.cfg.Pod.UID, now.Time)
	return true
}

// setClaimed makes r's status the claim's: Running, with startTime.
func setClaimed(r *v1alpha1.Run, now metav1.Time) {
	r.Status.Phase = v1alpha1.PhaseRunning
	if r.Status.StartTime == nil {
		r.Status.StartTime = &now
	}
	r.Status.Reason, r.Status.Message = "", ""
}

// deferClaim reports whether run, a task, starts before its claim is
// written (Config.RunningAfter): a task without stdin or a terminal, not
// annotated AnnotationClaimFirst, on a runtimed configured so; in a
// shared workspace only with a state directory for its mark. Its own
// directory, or in a shared workspace its mark (taken.go), is then the
// fence a claim is otherwise: made before the execution starts and kept
// while it may run, it tells a restarted runtimed that the Run was taken
// (see run).
func (w *worker) deferClaim(run *v1alpha1.Run, shared bool, dirErr error) bool {
	t := run.Spec.Mode.Task
	return w.d.cfg.RunningAfter > 0 && t != nil && !t.Stdin && !t.TTY && dirErr == nil &&
		(!shared || w.d.taken != "") && run.Annotations[v1alpha1.AnnotationClaimFirst] != "true"
}

// removeDir removes the Run's working directory once the worker is done
// with the Run. When the daemon stops first, what the Run started stays on
// the pod (see Run), and so does its directory: the pod's end removes it,
// or a restarted runtimed adopts the Run. A shared workspace stays for the
// next Run naming it, unless this Run releases it
// (spec.placement.releaseWorkspace): the owner's word that none follows;
// the Run's mark (taken.go) goes in both cases.
func (w *worker) removeDir(ctx context.Context, run *v1alpha1.Run, dir string, shared bool) {
	if ctx.Err() != nil {
		return
	}
	if shared {
		// Done with the Run (its end written, or it is no longer this
		// pod's): nothing is left to fence.
		if err := w.d.unmarkTaken(w.uid); err != nil {
			w.log.Warn("removing the mark of a taken run", "error", err)
		}
	}
	var err error
	switch {
	case !shared:
		err = w.d.cfg.WorkDirs.Remove(dir)
	case run.Spec.Placement.ReleaseWorkspace:
		err = runtime.RemoveDir(dir)
		w.log.Debug("released workspace", "workspace", run.Spec.Placement.Workspace)
	}
	if err != nil {
		w.log.Warn("removing working directory", "error", err)
	}
}
