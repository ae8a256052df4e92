package runtimed

import (
	"context"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/placement"
)

// The hand-off from a Run informer to the runtimed of each pod, the same
// in both modes: stoke up routes every Run to one of its pods' daemons,
// the sidecar in a runtime Pod hands the Runs of its own Pod to its one.

// Started is a Daemon running on its own goroutine.
type Started struct {
	*Daemon
	cancel context.CancelFunc
	done   chan struct{}
}

// Start builds a Daemon for cfg and runs it until Stop is called or
// parent ends. cfg.Conn stays the caller's to close, after Stop.
func Start(parent context.Context, cfg Config) *Started {
	d := New(cfg)
	ctx, cancel := context.WithCancel(parent)
	s := &Started{Daemon: d, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		_ = d.Run(ctx)
	}()
	return s
}

// Stop stops the daemon and waits until its workers have returned. It is
// safe to call more than once.
func (s *Started) Stop() {
	s.cancel()
	<-s.done
}

// Dispatch is an informer handler that tells the daemon of each Run's
// assigned pod about the Run, and the daemon of the pod a Run was placed
// on at its create about it until it is written (OnPlaced): every state
// on add and update, its last one on delete. daemon returns nil for a pod
// that has none here; a daemon started after Runs were assigned to its
// pod hears of them from Replay (or, registered later, from the
// informer's replay of its cache).
func Dispatch(daemon func(podUID string) *Daemon) informer.Handler[*v1alpha1.Run] {
	// target is the pod whose daemon hears of run: its assigned pod, or
	// the one it was placed on at its create while it is not written.
	target := func(run *v1alpha1.Run) (d *Daemon, placed bool) {
		uid := run.Status.AssignedPodUID
		if uid == "" {
			uid, placed = placement.Unclaimed(run), true
		}
		if uid == "" {
			return nil, false
		}
		return daemon(uid), placed
	}
	tell := func(run *v1alpha1.Run) {
		switch d, placed := target(run); {
		case d == nil:
		case placed:
			d.OnPlaced(run)
		default:
			d.OnRun(run)
		}
	}
	return informer.HandlerFuncs[*v1alpha1.Run]{
		AddFunc:    tell,
		UpdateFunc: func(_, run *v1alpha1.Run) { tell(run) },
		DeleteFunc: func(run *v1alpha1.Run) {
			if d, _ := target(run); d != nil {
				d.OnDelete(run)
			}
		},
	}
}

// Handler hands the daemon every change of an informer that holds only
// its pod's Runs (one filtered by store.ListOptions.AssignedPodUID): a
// Run that leaves the informer — deleted, or assigned to another pod —
// is gone from this pod, so its worker stops.
func (d *Daemon) Handler() informer.Handler[*v1alpha1.Run] {
	return informer.HandlerFuncs[*v1alpha1.Run]{
		AddFunc:    d.OnRun,
		UpdateFunc: func(_, run *v1alpha1.Run) { d.OnRun(run) },
		DeleteFunc: d.OnDelete,
	}
}

// PlacedHandler hands the daemon the Runs of an informer that holds the
// Runs placed on its pod at their create (one filtered by
// store.ListOptions.PlacedPodUID), while they are not written: beside
// Handler's informer, which has them from their first write on. A Run
// deleted before it was written is gone from this pod; one deleted later
// leaves Handler's informer too, which tells the daemon.
func (d *Daemon) PlacedHandler() informer.Handler[*v1alpha1.Run] {
	return informer.HandlerFuncs[*v1alpha1.Run]{
		AddFunc:    d.OnPlaced,
		UpdateFunc: func(_, run *v1alpha1.Run) { d.OnPlaced(run) },
		DeleteFunc: func(run *v1alpha1.Run) {
			if placement.Unclaimed(run) == d.cfg.Pod.UID {
				d.OnDelete(run)
			}
		},
	}
}

// Replay hands a daemon that has just started the Runs already assigned
// to its pod (or placed on it at their create), which Dispatch could not
// route to it before it existed.
func (d *Daemon) Replay(runs *informer.Informer[*v1alpha1.Run]) {
	for _, run := range runs.List(d.holds) {
		if run.Status.AssignedPodUID == d.cfg.Pod.UID {
			d.OnRun(run)
		} else {
			d.OnPlaced(run)
		}
	}
}

// RuntimeDefaults are the timeouts a Runtime gives Runs that set none
// (Config.DefaultTaskTimeout and DefaultFunctionTimeout).
func RuntimeDefaults(rt *v1alpha1.Runtime) (task, function time.Duration) {
	if d := rt.Spec.DefaultTaskTimeout; d != nil {
		task = d.Duration
	}
	if d := rt.Spec.DefaultFunctionTimeout; d != nil {
		function = d.Duration
	}
	return task, function
}
