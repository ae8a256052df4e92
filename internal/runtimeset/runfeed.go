package runtimeset

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// RunFeed gives the "runtime-status" controller the Runs from the
// leader's own informer of Runs (the scheduler's), so that the controller
// process watches and decodes each Run event once, not a second time in
// controller-runtime's cache. The leader registers the feed as a handler
// of its informer (it has the informer's OnAdd, OnUpdate and OnDelete) and
// attaches the informer's List once it exists; Reconcile waits for that,
// and for the informer's first sync, before it counts slots.
type RunFeed struct {
	mu       sync.Mutex
	list     func(filter func(*v1alpha1.Run) bool) []*v1alpha1.Run
	attached chan struct{} // closed by Attach
	synced   <-chan struct{}
	queue    workqueue.TypedRateLimitingInterface[reconcile.Request]
}

// NewRunFeed returns a feed with no informer attached yet.
func NewRunFeed() *RunFeed { return &RunFeed{attached: make(chan struct{})} }

// Attach gives the feed the informer's List and its synced channel
// (informer.Informer.List and Synced). It may be called once.
func (f *RunFeed) Attach(list func(filter func(*v1alpha1.Run) bool) []*v1alpha1.Run, synced <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.list, f.synced = list, synced
	close(f.attached)
}

// OnAdd is the informer's handler: a Run holding a slot changes its
// Runtime's free slots.
func (f *RunFeed) OnAdd(run *v1alpha1.Run) {
	if h, _ := heldSlot(run); h {
		f.enqueue(run)
	}
}

// OnUpdate is the informer's handler: a Run starting or stopping to hold a
// slot, or moving to another Pod, changes its Runtime's free slots.
func (f *RunFeed) OnUpdate(old, run *v1alpha1.Run) {
	oh, op := heldSlot(old)
	nh, np := heldSlot(run)
	if oh != nh || op != np {
		f.enqueue(run)
	}
}

// OnDelete is the informer's handler.
func (f *RunFeed) OnDelete(run *v1alpha1.Run) { f.OnAdd(run) }

// enqueue asks for the Run's Runtime's status; the work queue keeps one
// request per Runtime, so this never blocks the informer.
func (f *RunFeed) enqueue(run *v1alpha1.Run) {
	if run.Spec.Runtime == "" {
		return
	}
	f.mu.Lock()
	q := f.queue
	f.mu.Unlock()
	if q != nil {
		q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: run.Namespace, Name: run.Spec.Runtime}})
	}
}

// source is the controller's source of Run events: it starts with the
// controller and hands over its queue. Events before it starts are not
// lost: every Runtime is reconciled when the controller starts, from the
// Runtimes' own source.
func (f *RunFeed) source() source.Source {
	return source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.queue = q
		return nil
	})
}

// held is the Runs of namespace that hold a slot of the Runtime name, once
// the informer is attached and synced (ctx bounds the wait).
func (f *RunFeed) held(ctx context.Context, namespace, name string) ([]*v1alpha1.Run, error) {
	select {
	case <-f.attached:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	f.mu.Lock()
	list, synced := f.list, f.synced
	f.mu.Unlock()
	select {
	case <-synced:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return list(func(run *v1alpha1.Run) bool {
		h, _ := heldSlot(run)
		return h && run.Namespace == namespace && run.Spec.Runtime == name
	}), nil
}

// heldSlot says whether run holds a slot, and on which Pod.
func heldSlot(run *v1alpha1.Run) (bool, string) {
	if !run.Status.Phase.HoldsSlot() {
		return false, ""
	}
	return true, run.Status.AssignedPodUID
}
