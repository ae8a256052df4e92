package informer_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/store"
)

// heldRes holds its watches' events back until gate is closed: an
// informer deliberately behind the store, by a hook rather than by
// timing. onGet runs after each Get.
type heldRes struct {
	store.Resource[*v1alpha1.Run]
	gate  chan struct{}
	onGet func()
}

func (h *heldRes) Get(ctx context.Context, namespace, name string) (*v1alpha1.Run, error) {
	obj, err := h.Resource.Get(ctx, namespace, name)
	if h.onGet != nil {
		h.onGet()
	}
	return obj, err
}

func (h *heldRes) Watch(ctx context.Context, opts store.WatchOptions) (store.Watcher[*v1alpha1.Run], error) {
	w, err := h.Resource.Watch(ctx, opts)
	if err != nil {
		return nil, err
	}
	hw := &heldWatcher{w: w, out: make(chan store.Event[*v1alpha1.Run]), stop: make(chan struct{})}
	go func() {
		defer close(hw.out)
		for ev := range w.Events() {
			select {
			case <-h.gate:
			case <-hw.stop:
				return
			case <-ctx.Done():
				return
			}
			select {
			case hw.out <- ev:
			case <-hw.stop:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return hw, nil
}

type heldWatcher struct {
	w    store.Watcher[*v1alpha1.Run]
	out  chan store.Event[*v1alpha1.Run]
	once sync.Once
	stop chan struct{}
}

func (h *heldWatcher) Events() <-chan store.Event[*v1alpha1.Run] { return h.out }

func (h *heldWatcher) Stop() {
	h.once.Do(func() { close(h.stop) })
	h.w.Stop()
	for range h.out {
	}
}

// A Run created and changed while the informer is held behind the
// store: Fetch reads the store, finds it, and waits for the informer's
// events (the hook releases them only after that read) up to the version
// the store answered, answering the cache's copy; a Run the store does not have is NotFound at once; and a wait
// ends with its context. Before Fetch, the caller's cache miss was a 404.
func TestFetchWaitsForTheCacheOnAMiss(t *testing.T) {
	s := openStore(t)
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	res := &heldRes{Resource: s.Runs(), gate: make(chan struct{})}
	inf := informer.New[*v1alpha1.Run](res, informer.Options{})
	start(t, inf)

	created, err := s.Runs().Create(ctx, newRun("late"))
	if err != nil {
		t.Fatal(err)
	}
	// A second version behind the first: Fetch must wait for the one the
	// store answers, not stop at the create.
	created.Status.Phase = v1alpha1.PhaseScheduled
	updated, err := s.Runs().UpdateStatus(ctx, created)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := inf.Get("", "late"); ok {
		t.Fatal("the held informer has the Run already: the hook does not hold it")
	}
	var once sync.Once
	res.onGet = func() { once.Do(func() { close(res.gate) }) }
	got, err := inf.Fetch(ctx, "", "late")
	if err != nil {
		t.Fatalf("Fetch of a Run the store has: %v", err)
	}
	if got.UID != updated.UID || got.ResourceVersion != updated.ResourceVersion {
		t.Fatalf("Fetch answered %s at version %s, want %s at %s (the store's answer)", got.UID, got.ResourceVersion, updated.UID, updated.ResourceVersion)
	}
	if cached, ok := inf.Get("", "late"); !ok || cached != got {
		t.Fatal("Fetch did not answer the cache's own copy")
	}

	if _, err := inf.Fetch(ctx, "", "never"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Fetch of a Run nobody made: %v, want NotFound", err)
	}
}

// A Fetch whose caller goes away while the informer is still behind
// ends with the caller's context, not with a 404 and not later.
func TestFetchEndsWithItsContext(t *testing.T) {
	s := openStore(t)
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	res := &heldRes{Resource: s.Runs(), gate: make(chan struct{})}
	inf := informer.New[*v1alpha1.Run](res, informer.Options{})
	start(t, inf)
	if _, err := s.Runs().Create(ctx, newRun("held")); err != nil {
		t.Fatal(err)
	}
	callCtx, callCancel := context.WithCancel(ctx)
	res.onGet = callCancel // the caller leaves once the store has answered
	if _, err := inf.Fetch(callCtx, "", "held"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Fetch after its caller left: %v, want context.Canceled", err)
	}
}

// An informer of one phase holds only the Runs in it, and a Run leaving
// the phase leaves the cache; Fetch of a Run outside it answers the
// store's copy at once rather than waiting for a cache that will never
// hold it (the held watch would make such a wait run out of CatchUp:
// Unavailable). The Kubernetes gateway's informer of Ready Runs relies
// on both.
func TestPhaseInformerHoldsOnlyItsPhase(t *testing.T) {
	s := openStore(t)
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	task, err := s.Runs().Create(ctx, newRun("task"))
	if err != nil {
		t.Fatal(err)
	}
	fn, err := s.Runs().Create(ctx, newRun("fn"))
	if err != nil {
		t.Fatal(err)
	}
	fn.Status.Phase = v1alpha1.PhaseReady
	if fn, err = s.Runs().UpdateStatus(ctx, fn); err != nil {
		t.Fatal(err)
	}
	res := &heldRes{Resource: s.Runs(), gate: make(chan struct{})}
	inf := informer.New[*v1alpha1.Run](res, informer.Options{Phase: v1alpha1.PhaseReady})
	left := make(chan *v1alpha1.Run, 1)
	inf.AddEventHandler(informer.HandlerFuncs[*v1alpha1.Run]{DeleteFunc: func(r *v1alpha1.Run) { left <- r }})
	start(t, inf)
	if got := inf.List(func(*v1alpha1.Run) bool { return true }); len(got) != 1 || got[0].Name != "fn" {
		t.Fatalf("the Ready informer holds %d Runs (%v), want fn alone", len(got), got)
	}

	task.Status.Phase = v1alpha1.PhaseRunning
	if task, err = s.Runs().UpdateStatus(ctx, task); err != nil {
		t.Fatal(err)
	}
	got, err := inf.Fetch(ctx, "", "task")
	if err != nil {
		t.Fatalf("Fetch of a Running Run from a Ready informer: %v", err)
	}
	if got.UID != task.UID || got.ResourceVersion != task.ResourceVersion || got.Status.Phase != v1alpha1.PhaseRunning {
		t.Fatalf("Fetch answered %s at version %s (%s), want the store's %s at %s", got.UID, got.ResourceVersion, got.Status.Phase, task.UID, task.ResourceVersion)
	}
	if _, ok := inf.Get("", "task"); ok {
		t.Fatal("a Run outside the informer's phase is in its cache")
	}

	close(res.gate)
	fn.Status.Phase = v1alpha1.PhaseSucceeded
	if _, err := s.Runs().UpdateStatus(ctx, fn); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-left:
		if r.Name != "fn" || r.Status.Phase != v1alpha1.PhaseReady {
			t.Fatalf("OnDelete of %s in %s, want fn's last Ready state", r.Name, r.Status.Phase)
		}
	case <-ctx.Done():
		t.Fatal("a Run that left the phase stayed in the cache")
	}
	if _, ok := inf.Get("", "fn"); ok {
		t.Fatal("a Run that left the phase is still in the cache")
	}
}
