package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/store"
)

// nextEvent returns the watch's next event; the watch ending or no event within
// the timeout fails the test.
func nextEvent[T store.Object](t testing.TB, cfg *config, w store.Watcher[T]) store.Event[T] {
	t.Helper()
	timer := time.NewTimer(cfg.timeout)
	defer timer.Stop()
	select {
	case ev, ok := <-w.Events():
		if !ok {
			t.Fatal("the watch ended, want another event")
		}
		return ev
	case <-timer.C:
		t.Fatalf("no event within %v", cfg.timeout)
	}
	panic("unreachable")
}

// drain reads the watch until its channel closes and returns what it read;
// a channel still open after the timeout fails the test.
func drain[T store.Object](t testing.TB, cfg *config, w store.Watcher[T]) []store.Event[T] {
	t.Helper()
	timer := time.NewTimer(cfg.timeout)
	defer timer.Stop()
	var evs []store.Event[T]
	for {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				return evs
			}
			evs = append(evs, ev)
		case <-timer.C:
			t.Fatalf("the watch channel is still open after %v", cfg.timeout)
		}
	}
}

func (e *env[T]) watch(opts store.WatchOptions) store.Watcher[T] {
	e.t.Helper()
	w, err := e.r.Watch(e.ctx, opts)
	if err != nil {
		e.t.Fatalf("watch %+v: %v", opts, err)
	}
	e.t.Cleanup(w.Stop)
	return w
}

func testWatchFromNow[T store.Object](e *env[T]) {
	t := e.t
	e.create(nsA, "before") // not seen: it predates the watch
	for _, from := range []string{"", "0"} {
		t.Run("From"+map[string]string{"": "Empty", "0": "Zero"}[from], func(t *testing.T) {
			name := "now" + from
			w := e.watch(store.WatchOptions{ResourceVersion: from})

			created := e.create(nsA, name)
			ev := nextEvent(t, e.cfg, w)
			wantEvent(t, ev, store.Added, created)
			// The event's object is the receiver's own.
			ev.Object.SetLabels(map[string]string{"mutated": "by-receiver"})
			e.k.setSpec(ev.Object, 42)
			sameObject(t, "object after mutating an event", e.get(nsA, name), created)

			in := created.DeepCopyObject().(T)
			e.k.setSpec(in, 1)
			updated, err := e.r.Update(e.ctx, in)
			if err != nil {
				t.Fatal(err)
			}
			withStatus := e.updateStatus(updated, 2)
			if err := e.r.Delete(e.ctx, nsA, name, store.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			wantEvent(t, nextEvent(t, e.cfg, w), store.Modified, updated)
			wantEvent(t, nextEvent(t, e.cfg, w), store.Modified, withStatus)
			ev = nextEvent(t, e.cfg, w)
			if ev.Type != store.Deleted {
				t.Fatalf("event = %s, want DELETED", ev.Type)
			}
			if ev.Object.GetName() != name || ev.Object.GetUID() != created.GetUID() {
				t.Fatalf("deleted event carries %s/%s, want %s/%s", ev.Object.GetNamespace(), ev.Object.GetName(), nsA, name)
			}
			sameValue(t, "deleted object's status", e.k.status(ev.Object), e.k.status(withStatus))
			newVersion(t, "deleted event", ev.Object.GetResourceVersion(), withStatus.GetResourceVersion())
		})
	}
}

func testWatchFromListVersion[T store.Object](e *env[T]) {
	t := e.t
	// Even an empty store lists at a real version: "" and "0" would mean
	// "from now" to Watch and lose the writes after the list.
	_, emptyRV, err := e.r.List(e.ctx, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if emptyRV == "" || emptyRV == "0" {
		t.Fatalf("an empty store lists at resourceVersion %q", emptyRV)
	}
	a := e.create(nsA, "a")
	early := e.watch(store.WatchOptions{ResourceVersion: emptyRV})
	wantEvent(t, nextEvent(t, e.cfg, early), store.Added, a)
	e.create(nsA, "b")
	items, listRV, err := e.r.List(e.ctx, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sameValue(t, "listed", names(items), []string{"team-a/a", "team-a/b"})

	// Changes between the list and the watch are replayed.
	c := e.create(nsA, "c")
	a2 := e.updateStatus(a, 1)
	w := e.watch(store.WatchOptions{ResourceVersion: listRV})
	wantEvent(t, nextEvent(t, e.cfg, w), store.Added, c)
	wantEvent(t, nextEvent(t, e.cfg, w), store.Modified, a2)

	// And the watch goes on live.
	if err := e.r.Delete(e.ctx, nsA, "b", store.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, e.cfg, w)
	if ev.Type != store.Deleted || ev.Object.GetName() != "b" {
		t.Fatalf("event = %s %s, want DELETED b", ev.Type, ev.Object.GetName())
	}
}

// ack is one write a writer saw succeed.
type ack struct {
	writer int
	rv     string // "" for a delete, which returns no object
	typ    store.EventType
	name   string
}

func testWatchReplayConcurrentWriters[T store.Object](e *env[T]) {
	t := e.t
	const writers, perWriter = 4, 40
	_, startRV, err := e.r.List(e.ctx, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fromNow := e.watch(store.WatchOptions{})
	fromStart := e.watch(store.WatchOptions{ResourceVersion: startRV})

	acks := make(chan ack, writers*perWriter*3)
	errs := make(chan error, writers)
	var wg sync.WaitGroup
	for wi := range writers {
		wg.Go(func() {
			for i := range perWriter {
				name := fmt.Sprintf("w%d-%d", wi, i)
				obj, err := e.r.Create(e.ctx, e.k.object(nsA, name))
				if err != nil {
					errs <- err
					return
				}
				acks <- ack{wi, obj.GetResourceVersion(), store.Added, name}
				e.k.setStatus(obj, i+1)
				if obj, err = e.r.UpdateStatus(e.ctx, obj); err != nil {
					errs <- err
					return
				}
				acks <- ack{wi, obj.GetResourceVersion(), store.Modified, name}
				if i%3 == 0 {
					if err := e.r.Delete(e.ctx, nsA, name, store.DeleteOptions{}); err != nil {
						errs <- err
						return
					}
					acks <- ack{wi, "", store.Deleted, name}
				}
			}
		})
	}

	// Halfway through, list and start a third watch from that list's
	// version: list + watch must mirror the final state exactly.
	var all []ack
	total := writers * (perWriter*2 + (perWriter+2)/3)
	for len(all) < total/2 {
		all = append(all, <-acks)
	}
	midItems, midRV, err := e.r.List(e.ctx, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fromMid := e.watch(store.WatchOptions{ResourceVersion: midRV})
	wg.Wait()
	close(acks)
	close(errs)
	for err := range errs {
		t.Fatalf("writer: %v", err)
	}
	for a := range acks {
		all = append(all, a)
	}
	if len(all) != total {
		t.Fatalf("writers acknowledged %d writes, want %d", len(all), total)
	}
	finalItems, _, err := e.r.List(e.ctx, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A last write marks the end: each watch is read up to it.
	sentinel := e.create(nsB, "sentinel")

	// collect reads a watch up to the sentinel (not included).
	collect := func(t *testing.T, w store.Watcher[T]) []store.Event[T] {
		t.Helper()
		var evs []store.Event[T]
		versions := map[string]bool{}
		for {
			ev := nextEvent(t, e.cfg, w)
			if ev.Type == store.Error {
				t.Fatalf("watch failed: %v", ev.Err)
			}
			if ev.Object.GetName() == sentinel.GetName() {
				wantEvent(t, ev, store.Added, sentinel)
				return evs
			}
			v := ev.Object.GetResourceVersion()
			if versions[v] {
				t.Fatalf("two events at resourceVersion %s", v)
			}
			versions[v] = true
			evs = append(evs, ev)
		}
	}
	// inWriterOrder fails unless the events of each writer's objects come
	// in the order the writer made them: one writer's writes are ordered,
	// so their commits are, and a watch delivers commit order.
	inWriterOrder := func(t *testing.T, evs []store.Event[T], complete bool) {
		t.Helper()
		byWriter := make([][]ack, writers)
		for _, a := range all {
			byWriter[a.writer] = append(byWriter[a.writer], a)
		}
		pos := make([]int, writers)
		for _, ev := range evs {
			var wi, i int
			if _, err := fmt.Sscanf(ev.Object.GetName(), "w%d-%d", &wi, &i); err != nil || wi < 0 || wi >= writers {
				t.Fatalf("event for %s, which no writer wrote", ev.Object.GetName())
			}
			// A watch that starts midway skips each writer's earlier writes.
			for !complete && pos[wi] < len(byWriter[wi]) && !sameWrite(byWriter[wi][pos[wi]], ev) {
				pos[wi]++
			}
			if pos[wi] >= len(byWriter[wi]) || !sameWrite(byWriter[wi][pos[wi]], ev) {
				t.Fatalf("event %s %s at %s is not writer %d's next write", ev.Type, ev.Object.GetName(), ev.Object.GetResourceVersion(), wi)
			}
			pos[wi]++
		}
		if complete {
			for wi, p := range pos {
				if p != len(byWriter[wi]) {
					t.Fatalf("writer %d made %d writes, the watch saw %d", wi, len(byWriter[wi]), p)
				}
			}
		}
	}
	for _, tc := range []struct {
		name string
		w    store.Watcher[T]
	}{{"FromNow", fromNow}, {"FromStartList", fromStart}} {
		t.Run(tc.name, func(t *testing.T) {
			evs := collect(t, tc.w)
			if len(evs) != total {
				t.Fatalf("saw %d events, want one per write: %d", len(evs), total)
			}
			// Every acknowledged write is there, once, as its own type,
			// in each writer's order.
			inWriterOrder(t, evs, true)
		})
	}
	t.Run("FromMidList", func(t *testing.T) {
		// Apply the watch to the halfway list, as an informer does; the
		// result must be the final list.
		mirror := map[string]string{}
		for _, it := range midItems {
			mirror[it.GetName()] = it.GetResourceVersion()
		}
		evs := collect(t, fromMid)
		inWriterOrder(t, evs, false)
		for _, ev := range evs {
			name, v := ev.Object.GetName(), ev.Object.GetResourceVersion()
			switch ev.Type {
			case store.Added:
				if _, ok := mirror[name]; ok {
					t.Fatalf("ADDED %s, which the list already had", name)
				}
				mirror[name] = v
			case store.Modified:
				had, ok := mirror[name]
				if !ok {
					t.Fatalf("MODIFIED %s, which is neither listed nor added", name)
				}
				if had == v {
					t.Fatalf("MODIFIED %s at %s, the version the list already had", name, v)
				}
				mirror[name] = v
			case store.Deleted:
				if _, ok := mirror[name]; !ok {
					t.Fatalf("DELETED %s, which is neither listed nor added", name)
				}
				delete(mirror, name)
			}
		}
		want := map[string]string{}
		for _, it := range finalItems {
			want[it.GetName()] = it.GetResourceVersion()
		}
		sameValue(t, "list at half + watch vs final list", mirror, want)
	})
}

// sameWrite reports whether ev is the event of write a.
func sameWrite[T store.Object](a ack, ev store.Event[T]) bool {
	return a.typ == ev.Type && a.name == ev.Object.GetName() && (a.rv == "" || a.rv == ev.Object.GetResourceVersion())
}

func testWatchNamespace[T store.Object](e *env[T]) {
	t := e.t
	_, startRV, err := e.r.List(e.ctx, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	onlyA := e.watch(store.WatchOptions{Namespace: nsA})
	b := e.create(nsB, "b")
	a := e.create(nsA, "a")
	b2 := e.updateStatus(b, 1)
	a2 := e.updateStatus(a, 1)
	wantEvent(t, nextEvent(t, e.cfg, onlyA), store.Added, a)
	wantEvent(t, nextEvent(t, e.cfg, onlyA), store.Modified, a2)

	// The filter applies to the replayed part too.
	onlyB := e.watch(store.WatchOptions{ResourceVersion: startRV, Namespace: nsB})
	wantEvent(t, nextEvent(t, e.cfg, onlyB), store.Added, b)
	wantEvent(t, nextEvent(t, e.cfg, onlyB), store.Modified, b2)
}

func testWatchInvalidVersion[T store.Object](e *env[T]) {
	_, err := e.r.Watch(e.ctx, store.WatchOptions{ResourceVersion: "not-a-version"})
	wantErr(e.t, err, errdefs.ErrInvalidArgument)
}

func testWatchExpired[T store.Object](e *env[T]) {
	t := e.t
	first := e.create(nsA, "old")
	obj := first
	switch {
	case e.cfg.historyLimit > 0:
		for i := range e.cfg.historyLimit + 1 {
			obj = e.updateStatus(obj, i+1)
		}
	case e.cfg.expire != nil:
		e.cfg.expire(t)
	default:
		t.Fatal("the suite needs storetest.WithHistoryLimit or storetest.WithExpiry to make a version expire")
	}
	w, err := e.r.Watch(e.ctx, store.WatchOptions{ResourceVersion: first.GetResourceVersion()})
	if err == nil {
		// Some stores report it as the first event instead.
		defer w.Stop()
		ev := nextEvent(t, e.cfg, w)
		if ev.Type != store.Error {
			t.Fatalf("watch from a version older than the history delivered %s, want ERROR", ev.Type)
		}
		err = ev.Err
		if rest := drain(t, e.cfg, w); len(rest) != 0 {
			t.Fatalf("%d events after the ERROR event", len(rest))
		}
	}
	wantErr(t, err, errdefs.ErrExpired)

	// A recent version is still watchable.
	obj = e.updateStatus(e.get(nsA, "old"), 0)
	recent := e.watch(store.WatchOptions{ResourceVersion: obj.GetResourceVersion()})
	last := e.updateStatus(obj, 1)
	wantEvent(t, nextEvent(t, e.cfg, recent), store.Modified, last)
}

func testSlowWatcher[T store.Object](e *env[T]) {
	t := e.t
	const n = 2000
	obj := e.create(nsA, "busy")
	slow := e.watch(store.WatchOptions{ResourceVersion: obj.GetResourceVersion()})
	fast := e.watch(store.WatchOptions{ResourceVersion: obj.GetResourceVersion()})

	type result struct {
		evs []store.Event[T]
		err error
	}
	fastDone := make(chan result, 1)
	go func() {
		var r result
		for len(r.evs) < n {
			ev, ok := <-fast.Events()
			if !ok {
				r.err = errors.New("the watch ended")
				break
			}
			if ev.Type == store.Error {
				r.err = ev.Err
				break
			}
			r.evs = append(r.evs, ev)
		}
		fastDone <- r
	}()

	// Writers must not wait for the slow watcher: every write completes
	// while it reads nothing (a blocked write would hit the test context's
	// deadline).
	var versions []string
	for i := range n {
		obj = e.updateStatus(obj, i+1)
		versions = append(versions, obj.GetResourceVersion())
	}

	timer := time.NewTimer(e.cfg.timeout)
	defer timer.Stop()
	var r result
	select {
	case r = <-fastDone:
	case <-timer.C:
		t.Fatalf("the reading watcher did not get %d events within %v", n, e.cfg.timeout)
	}
	if r.err != nil {
		t.Fatalf("the reading watcher failed after %d events: %v", len(r.evs), r.err)
	}
	for i, ev := range r.evs {
		if ev.Type != store.Modified || ev.Object.GetResourceVersion() != versions[i] {
			t.Fatalf("reading watcher event %d = %s at %s, want MODIFIED at %s", i, ev.Type, ev.Object.GetResourceVersion(), versions[i])
		}
	}

	// The slow watcher got a gap-free prefix, then either everything
	// (it was buffered) or an ERROR wrapping ErrExpired and the end.
	for i := 0; i < n; i++ {
		ev := nextEvent(t, e.cfg, slow)
		if ev.Type == store.Error {
			wantErr(t, ev.Err, errdefs.ErrExpired)
			if rest := drain(t, e.cfg, slow); len(rest) != 0 {
				t.Fatalf("%d events after the ERROR event", len(rest))
			}
			t.Logf("the slow watcher was ended after %d events: %v", i, ev.Err)
			return
		}
		if ev.Object.GetResourceVersion() != versions[i] {
			t.Fatalf("slow watcher event %d at %s, want %s: a gap or reordering", i, ev.Object.GetResourceVersion(), versions[i])
		}
	}
	t.Logf("the slow watcher was buffered all %d events", n)
}

func testWatchEnds[T store.Object](e *env[T]) {
	t := e.t
	t.Run("ContextCancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(e.ctx)
		w, err := e.r.Watch(ctx, store.WatchOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		e.create(nsA, "pending-1") // undelivered events do not keep it open
		e.create(nsA, "pending-2")
		cancel()
		drain(t, e.cfg, w)
	})
	t.Run("CancelledDuringReplay", func(t *testing.T) {
		obj := e.create(nsA, "replayed")
		for i := range 50 {
			obj = e.updateStatus(obj, i+1)
		}
		ctx, cancel := context.WithCancel(e.ctx)
		w, err := e.r.Watch(ctx, store.WatchOptions{ResourceVersion: "1"})
		if err != nil && !errors.Is(err, errdefs.ErrExpired) {
			t.Fatal(err)
		}
		if err == nil {
			defer w.Stop()
			nextEvent(t, e.cfg, w)
			cancel()
			drain(t, e.cfg, w)
		}
		cancel()
	})
	t.Run("Stop", func(t *testing.T) {
		w, err := e.r.Watch(e.ctx, store.WatchOptions{})
		if err != nil {
			t.Fatal(err)
		}
		e.create(nsA, "unread")
		var wg sync.WaitGroup
		for range 3 { // from several goroutines, more than once
			wg.Go(w.Stop)
		}
		wg.Wait()
		w.Stop()
		drain(t, e.cfg, w)
	})
}

func testWatchSeesOneKind(t *testing.T, s store.Store, cfg *config) {
	ctx := testContext(t, cfg)
	w, err := s.Runs().Watch(ctx, store.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if _, err := s.Runtimes().Create(ctx, runtimeCase.object(nsA, "pool")); err != nil {
		t.Fatal(err)
	}
	run, err := s.Runs().Create(ctx, runCase.object(nsA, "job"))
	if err != nil {
		t.Fatal(err)
	}
	wantEvent(t, nextEvent(t, cfg, w), store.Added, run)
}

func testWatchAssignedPod(t *testing.T, s store.Store, cfg *config) {
	ctx := testContext(t, cfg)
	runs := s.Runs()
	_, startRV, err := runs.List(ctx, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mine := store.WatchOptions{AssignedPodUID: podUID1}
	live, err := runs.Watch(ctx, mine)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Stop()

	create := func(name string) *v1alpha1.Run {
		t.Helper()
		r, err := runs.Create(ctx, runCase.object(nsA, name))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	type want struct {
		typ store.EventType
		obj *v1alpha1.Run
	}
	var wants []want
	r := create("moved") // unassigned: not seen
	r = assign(t, ctx, runs, r, v1alpha1.PhaseScheduled, podUID1)
	wants = append(wants, want{store.Added, r}) // enters the set
	r = assign(t, ctx, runs, r, v1alpha1.PhaseRunning, podUID1)
	wants = append(wants, want{store.Modified, r})
	last := r
	r = assign(t, ctx, runs, r, v1alpha1.PhasePending, podUID2)
	// Leaves the set: its last state in the set, at the version that
	// took it out.
	left := last.DeepCopy()
	left.ResourceVersion = r.ResourceVersion
	wants = append(wants, want{store.Deleted, left})
	assign(t, ctx, runs, create("other"), v1alpha1.PhaseScheduled, podUID2) // never seen
	d := assign(t, ctx, runs, create("deleted"), v1alpha1.PhaseScheduled, podUID1)
	wants = append(wants, want{store.Added, d})
	if err := runs.Delete(ctx, nsA, "deleted", store.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wants = append(wants, want{store.Deleted, nil})
	end := assign(t, ctx, runs, create("end"), v1alpha1.PhaseScheduled, podUID1)
	wants = append(wants, want{store.Added, end})

	check := func(t *testing.T, w store.Watcher[*v1alpha1.Run]) {
		for _, wt := range wants {
			ev := nextEvent(t, cfg, w)
			if wt.obj == nil {
				if ev.Type != wt.typ || ev.Object.Name != "deleted" {
					t.Fatalf("event %s %v, want %s deleted", ev.Type, ev.Object, wt.typ)
				}
				continue
			}
			wantEvent(t, ev, wt.typ, wt.obj)
		}
	}
	t.Run("Live", func(t *testing.T) { check(t, live) })
	t.Run("Replayed", func(t *testing.T) {
		w, err := runs.Watch(ctx, store.WatchOptions{ResourceVersion: startRV, AssignedPodUID: podUID1})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		check(t, w)
	})
	t.Run("RuntimesHaveNoPod", func(t *testing.T) {
		w, err := s.Runtimes().Watch(ctx, store.WatchOptions{AssignedPodUID: podUID1})
		if err == nil {
			w.Stop()
		}
		wantErr(t, err, errdefs.ErrInvalidArgument)
	})
}

// testWatchPhase: a watch of one phase sees Runs enter it (Added), change
// in it (Modified) and leave it (Deleted, with their last state in it),
// live and replayed, and nothing of Runs outside it: the Kubernetes
// gateway watches only Ready Runs so that task Runs cost it nothing.
func testWatchPhase(t *testing.T, s store.Store, cfg *config) {
	ctx := testContext(t, cfg)
	runs := s.Runs()
	_, startRV, err := runs.List(ctx, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ready := store.WatchOptions{Phase: v1alpha1.PhaseReady}
	live, err := runs.Watch(ctx, ready)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Stop()
	create := func(name string) *v1alpha1.Run {
		t.Helper()
		r, err := runs.Create(ctx, runCase.object(nsA, name))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	type want struct {
		typ store.EventType
		obj *v1alpha1.Run
	}
	var wants []want
	task := create("task") // never Ready: never seen
	task = assign(t, ctx, runs, task, v1alpha1.PhaseScheduled, podUID1)
	task = assign(t, ctx, runs, task, v1alpha1.PhaseRunning, podUID1)
	assign(t, ctx, runs, task, v1alpha1.PhaseSucceeded, podUID1)
	r := assign(t, ctx, runs, create("fn"), v1alpha1.PhaseScheduled, podUID1)
	r = assign(t, ctx, runs, r, v1alpha1.PhaseReady, podUID1)
	wants = append(wants, want{store.Added, r}) // enters the set
	r = assign(t, ctx, runs, r, v1alpha1.PhaseReady, podUID2)
	wants = append(wants, want{store.Modified, r})
	last := r
	r = assign(t, ctx, runs, r, v1alpha1.PhaseSucceeded, podUID2)
	left := last.DeepCopy()
	left.ResourceVersion = r.ResourceVersion
	wants = append(wants, want{store.Deleted, left})
	end := assign(t, ctx, runs, create("end"), v1alpha1.PhaseReady, podUID1)
	wants = append(wants, want{store.Added, end})

	check := func(t *testing.T, w store.Watcher[*v1alpha1.Run]) {
		for _, wt := range wants {
			wantEvent(t, nextEvent(t, cfg, w), wt.typ, wt.obj)
		}
	}
	t.Run("Live", func(t *testing.T) { check(t, live) })
	t.Run("Replayed", func(t *testing.T) {
		w, err := runs.Watch(ctx, store.WatchOptions{ResourceVersion: startRV, Phase: v1alpha1.PhaseReady})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		check(t, w)
	})
	t.Run("RuntimesHaveNoPhase", func(t *testing.T) {
		w, err := s.Runtimes().Watch(ctx, store.WatchOptions{Phase: v1alpha1.PhaseReady})
		if err == nil {
			w.Stop()
		}
		wantErr(t, err, errdefs.ErrInvalidArgument)
	})
}
