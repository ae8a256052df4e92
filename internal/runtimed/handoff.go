package runtimed

import (
	"context"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/informer"
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
// assigned pod about the Run: every state on add and update, its last one
// on delete. daemon returns nil for a pod that has none here; a daemon
// started after Runs were assigned to its pod hears of them from Replay
// (or, registered later, from the informer's replay of its cache).
func Dispatch(daemon func(podUID string) *Daemon) informer.Handler[*v1alpha1.Run] {
	route := func(run *v1alpha1.Run) *Daemon {
		if run.Status.AssignedPodUID == "" {
			return nil
		}
		return daemon(run.Status.AssignedPodUID)
	}
	return informer.HandlerFuncs[*v1alpha1.Run]{
		AddFunc: func(run *v1alpha1.Run) {
			if d := route(run); d != nil {
				d.OnRun(run)
			}
		},
		UpdateFunc: func(_, run *v1alpha1.Run) {
			if d := route(run); d != nil {
				d.OnRun(run)
			}
		},
		DeleteFunc: func(run *v1alpha1.Run) {
			if d := route(run); d != nil {
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

// Replay hands a daemon that has just started the Runs already assigned
// to its pod, which Dispatch could not route to it before it existed.
func (d *Daemon) Replay(runs *informer.Informer[*v1alpha1.Run]) {
	for _, run := range runs.List(func(r *v1alpha1.Run) bool { return r.Status.AssignedPodUID == d.cfg.Pod.UID }) {
		d.OnRun(run)
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
