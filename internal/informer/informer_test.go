package informer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"stoke.dev/stoke/internal/syncbuf"

	"go.uber.org/goleak"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/sqlite"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitTimeout bounds every wait; nothing sleeps.
const waitTimeout = 20 * time.Second

func openStore(t *testing.T, opts ...sqlite.Option) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(context.Background(), t.TempDir(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newRun(name string) *v1alpha1.Run {
	r := &v1alpha1.Run{Spec: v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"true"}}}}}
	r.Name = name
	return r
}

// countingRes counts List calls, to tell a re-list from a re-watch.
type countingRes struct {
	store.Resource[*v1alpha1.Run]
	lists atomic.Int32
}

func (c *countingRes) List(ctx context.Context, opts store.ListOptions) ([]*v1alpha1.Run, string, error) {
	c.lists.Add(1)
	return c.Resource.List(ctx, opts)
}

// recorder is a Handler that logs every call and keeps the state the calls
// describe.
type recorder struct {
	mu      sync.Mutex
	calls   []string
	state   map[string]string // name → resourceVersion
	changed chan struct{}
	// gate, when set, blocks the handler on the first update of the named
	// object until it is closed.
	gateName string
	gate     chan struct{}
	gated    chan struct{}
}

func newRecorder() *recorder {
	return &recorder{state: map[string]string{}, changed: make(chan struct{}, 1)}
}

func (r *recorder) note(call string, obj *v1alpha1.Run, deleted bool) {
	r.mu.Lock()
	r.calls = append(r.calls, call+" "+obj.Name)
	if deleted {
		delete(r.state, obj.Name)
	} else {
		r.state[obj.Name] = obj.ResourceVersion
	}
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *recorder) OnAdd(obj *v1alpha1.Run) { r.note("add", obj, false) }
func (r *recorder) OnUpdate(old, obj *v1alpha1.Run) {
	if old.Name != obj.Name || old.ResourceVersion == obj.ResourceVersion {
		panic(fmt.Sprintf("bad update %s@%s → %s@%s", old.Name, old.ResourceVersion, obj.Name, obj.ResourceVersion))
	}
	r.note("update", obj, false)
	if r.gate != nil && obj.Name == r.gateName {
		g := r.gate
		r.gate = nil
		close(r.gated)
		<-g
	}
}
func (r *recorder) OnDelete(obj *v1alpha1.Run) { r.note("delete", obj, true) }

// waitFor waits until cond holds for the recorder's state.
func (r *recorder) waitFor(t *testing.T, what string, cond func(state map[string]string) bool) {
	t.Helper()
	deadline := time.NewTimer(waitTimeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		ok := cond(r.state)
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-r.changed:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func (r *recorder) callsSince(n int) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls[n:]...)
}

func (r *recorder) numCalls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

// start runs inf until the test ends.
func start[T store.Object](t *testing.T, inf *informer.Informer[T]) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- inf.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	if err := inf.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
}

// checkMirror compares the informer's cache with the store.
func checkMirror(t *testing.T, inf *informer.Informer[*v1alpha1.Run], res store.Resource[*v1alpha1.Run]) {
	t.Helper()
	items, _, err := res.List(context.Background(), store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cached := inf.List(nil)
	if len(cached) != len(items) {
		t.Errorf("cache holds %d objects, store %d", len(cached), len(items))
	}
	for _, it := range items {
		got, ok := inf.Get(it.Namespace, it.Name)
		if !ok || got.ResourceVersion != it.ResourceVersion || got.UID != it.UID {
			t.Errorf("cache has %s at %v, store at %s", it.Name, got, it.ResourceVersion)
		}
	}
}

func TestListWatchAndHandlers(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	runs := s.Runs()
	a, err := runs.Create(ctx, newRun("a"))
	if err != nil {
		t.Fatal(err)
	}
	inf := informer.New(runs, informer.Options{})
	rec := newRecorder()
	inf.AddEventHandler(rec)
	if inf.HasSynced() {
		t.Fatal("synced before Run")
	}
	start(t, inf)
	if !inf.HasSynced() {
		t.Fatal("not synced after WaitForSync")
	}
	if got, ok := inf.Get("", "a"); !ok || got.UID != a.UID {
		t.Fatalf("Get(a) = %v, %v", got, ok)
	}

	b, err := runs.Create(ctx, newRun("b"))
	if err != nil {
		t.Fatal(err)
	}
	b.Status.Phase = v1alpha1.PhasePending
	if b, err = runs.UpdateStatus(ctx, b); err != nil {
		t.Fatal(err)
	}
	if err := runs.Delete(ctx, "", "a", store.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	rec.waitFor(t, "b pending and a deleted", func(st map[string]string) bool {
		_, hasA := st["a"]
		return !hasA && st["b"] == b.ResourceVersion
	})
	want := []string{"add a", "add b", "update b", "delete a"}
	if got := rec.callsSince(0); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("calls %v, want %v", got, want)
	}
	if got := inf.List(func(r *v1alpha1.Run) bool { return r.Status.Phase == v1alpha1.PhasePending }); len(got) != 1 || got[0].Name != "b" {
		t.Errorf("List(pending) = %v", got)
	}
	if inf.ResourceVersion() != b.ResourceVersion && inf.ResourceVersion() == "" {
		t.Errorf("ResourceVersion %q", inf.ResourceVersion())
	}

	// A handler added late is told about what the cache holds, then
	// follows.
	late := newRecorder()
	remove := inf.AddEventHandler(late)
	if got := late.callsSince(0); len(got) != 1 || got[0] != "add b" {
		t.Errorf("late handler replay %v", got)
	}
	if _, err := runs.Create(ctx, newRun("c")); err != nil {
		t.Fatal(err)
	}
	late.waitFor(t, "c", func(st map[string]string) bool { return st["c"] != "" })
	remove()
	n := late.numCalls()
	if _, err := runs.Create(ctx, newRun("d")); err != nil {
		t.Fatal(err)
	}
	rec.waitFor(t, "d", func(st map[string]string) bool { return st["d"] != "" })
	if late.numCalls() != n {
		t.Errorf("a removed handler was called: %v", late.callsSince(n))
	}
	checkMirror(t, inf, runs)
}

// TestResyncAfterExpiry stalls the informer's handler until its watch falls
// behind and the store prunes the history it needs, then checks that the
// informer re-lists, ends up an exact mirror, and tells handlers only
// about what changed during the stall.
func TestResyncAfterExpiry(t *testing.T) {
	ctx := context.Background()
	var logs syncbuf.Buffer
	s := openStore(t, sqlite.WithWatchBuffer(1), sqlite.WithEventRetention(16))
	res := &countingRes{Resource: s.Runs()}
	for _, n := range []string{"unchanged", "modified", "deleted", "filler", "gate"} {
		if _, err := res.Create(ctx, newRun(n)); err != nil {
			t.Fatal(err)
		}
	}
	inf := informer.New[*v1alpha1.Run](res, informer.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	rec := newRecorder()
	gate := make(chan struct{})
	rec.gateName, rec.gate, rec.gated = "gate", gate, make(chan struct{})
	inf.AddEventHandler(rec)
	start(t, inf)

	update := func(name string) {
		t.Helper()
		r, err := res.Get(ctx, "", name)
		if err != nil {
			t.Fatal(err)
		}
		r.Status.Attempt++
		if _, err := res.UpdateStatus(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	update("gate")
	<-rec.gated // the handler now blocks the informer
	mark := rec.numCalls()
	for range 300 {
		update("filler")
	}
	update("modified")
	if err := res.Delete(ctx, "", "deleted", store.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := res.Create(ctx, newRun("added")); err != nil {
		t.Fatal(err)
	}
	sentinel, err := res.Create(ctx, newRun("sentinel"))
	if err != nil {
		t.Fatal(err)
	}
	close(gate)
	rec.waitFor(t, "sentinel", func(st map[string]string) bool { return st["sentinel"] == sentinel.ResourceVersion })

	if res.lists.Load() < 2 {
		t.Fatalf("no re-list happened (lists: %d); logs:\n%s", res.lists.Load(), logs.String())
	}
	checkMirror(t, inf, res)
	counts := map[string]int{}
	for _, c := range rec.callsSince(mark) {
		counts[c]++
	}
	for call, want := range map[string]int{
		"add unchanged": 0, "update unchanged": 0, "add modified": 0, "update modified": 1,
		"delete deleted": 1, "add added": 1, "add sentinel": 1, "update gate": 0, "add filler": 0,
	} {
		if counts[call] != want {
			t.Errorf("%q called %d times after the stall, want %d (calls %v)", call, counts[call], want, counts)
		}
	}
	// The handler's own view of the world matches the store.
	items, _, err := res.List(ctx, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.state) != len(items) {
		t.Errorf("handler sees %d objects, store has %d", len(rec.state), len(items))
	}
	for _, it := range items {
		if rec.state[it.Name] != it.ResourceVersion {
			t.Errorf("handler sees %s at %q, store at %s", it.Name, rec.state[it.Name], it.ResourceVersion)
		}
	}
}

// TestRewatchAfterFallingBehind: a consumer that falls behind but whose
// history is still kept resumes with a watch, without a re-list, and
// misses nothing.
func TestRewatchAfterFallingBehind(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, sqlite.WithWatchBuffer(1))
	res := &countingRes{Resource: s.Runs()}
	if _, err := res.Create(ctx, newRun("gate")); err != nil {
		t.Fatal(err)
	}
	inf := informer.New[*v1alpha1.Run](res, informer.Options{})
	rec := newRecorder()
	gate := make(chan struct{})
	rec.gateName, rec.gate, rec.gated = "gate", gate, make(chan struct{})
	inf.AddEventHandler(rec)
	start(t, inf)

	r, err := res.Get(ctx, "", "gate")
	if err != nil {
		t.Fatal(err)
	}
	r.Status.Attempt = 1
	if _, err := res.UpdateStatus(ctx, r); err != nil {
		t.Fatal(err)
	}
	<-rec.gated
	mark := rec.numCalls()
	var last *v1alpha1.Run
	for i := range 200 {
		if last, err = res.Create(ctx, newRun(fmt.Sprintf("r%03d", i))); err != nil {
			t.Fatal(err)
		}
	}
	close(gate)
	rec.waitFor(t, "last", func(st map[string]string) bool { return st[last.Name] == last.ResourceVersion })
	if n := res.lists.Load(); n != 1 {
		t.Errorf("%d lists, want 1 (a re-watch should have sufficed)", n)
	}
	if calls := rec.callsSince(mark); len(calls) != 200 {
		t.Errorf("%d calls after the stall, want 200 adds", len(calls))
	}
	checkMirror(t, inf, res)
}

func TestRunTwice(t *testing.T) {
	s := openStore(t)
	inf := informer.New(s.Runs(), informer.Options{})
	start(t, inf)
	if err := inf.Run(context.Background()); err == nil {
		t.Fatal("second Run did not fail")
	}
}

func TestNamespaceScope(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	other := newRun("x")
	other.Namespace = "other"
	if _, err := s.Runs().Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Runs().Create(ctx, newRun("y")); err != nil {
		t.Fatal(err)
	}
	inf := informer.New(s.Runs(), informer.Options{Namespace: "other"})
	rec := newRecorder()
	inf.AddEventHandler(rec)
	start(t, inf)
	if _, err := s.Runs().Create(ctx, newRun("z")); err != nil {
		t.Fatal(err)
	}
	w := newRun("w")
	w.Namespace = "other"
	if _, err := s.Runs().Create(ctx, w); err != nil {
		t.Fatal(err)
	}
	rec.waitFor(t, "w", func(st map[string]string) bool { return st["w"] != "" })
	if got := inf.List(nil); len(got) != 2 {
		t.Errorf("cache holds %d objects, want 2", len(got))
	}
	if _, ok := inf.Get("other", "x"); !ok {
		t.Error("other/x missing")
	}
}

// A reader of the store waits for the cache to reach what it read; a
// version the store has not reached yet is waited for until the context
// ends.
func TestWaitForResourceVersion(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	runs := s.Runs()
	inf := informer.New(runs, informer.Options{})
	start(t, inf)
	for i := range 20 {
		created, err := runs.Create(ctx, newRun(fmt.Sprintf("r%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, waitTimeout)
		err = inf.WaitForResourceVersion(wctx, created.ResourceVersion)
		cancel()
		if err != nil {
			t.Fatalf("waiting for %s: %v", created.ResourceVersion, err)
		}
		if got, ok := inf.Get("", created.Name); !ok || got.UID != created.UID {
			t.Fatalf("after the wait the cache lacks %s", created.Name)
		}
	}
	next, err := strconv.ParseUint(inf.ResourceVersion(), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := inf.WaitForResourceVersion(wctx, strconv.FormatUint(next+1, 10)); !errors.Is(err, context.Canceled) {
		t.Errorf("waiting for a version not reached: %v, want the context's error", err)
	}
	if err := inf.WaitForResourceVersion(wctx, "not-a-number"); err != nil {
		t.Errorf("a version not the store's: %v, want no wait", err)
	}

	// Over a store whose versions are opaque (store.VersionOrder hidden,
	// as the Kubernetes store has none) it refuses to guess an order.
	opaque := informer.New[*v1alpha1.Run](struct{ store.Resource[*v1alpha1.Run] }{runs}, informer.Options{})
	if err := opaque.WaitForResourceVersion(ctx, "1"); !errors.Is(err, errdefs.ErrUnimplemented) {
		t.Errorf("waiting over a store with opaque versions: %v, want ErrUnimplemented", err)
	}
}
