package loadreport_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	testingclock "k8s.io/utils/clock/testing"

	"stoke.dev/stoke/internal/kubetest"
	"stoke.dev/stoke/internal/loadreport"
)

func TestMain(m *testing.M) { kubetest.Main(m, kubetest.Options{}) }

var t0 = time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)

const bound = time.Minute

// loads is a gateway's loads as its test sets them.
type loads struct {
	mu sync.Mutex
	r  loadreport.Report
	// read gets a value each time the writer reads the loads.
	read chan struct{}
}

func (l *loads) set(r loadreport.Report) {
	l.mu.Lock()
	l.r = r
	l.mu.Unlock()
}

func (l *loads) get() loadreport.Report {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case l.read <- struct{}{}:
	default:
	}
	return maps.Clone(l.r)
}

// step steps the gateway's clock by d and waits until the writer has
// read its loads (it does on each period).
func (g *gateway) step(t *testing.T, d time.Duration) {
	t.Helper()
	for len(g.loads.read) > 0 {
		<-g.loads.read
	}
	g.clk.Step(d)
	select {
	case <-g.loads.read:
	case <-time.After(bound):
		t.Fatal("the writer did not read its loads on its period")
	}
}

// gateway is one Writer on a fake clock of its own.
type gateway struct {
	w     *loadreport.Writer
	clk   *testingclock.FakeClock
	loads *loads
	stop  context.CancelFunc
	done  chan struct{}
}

func startGateway(t *testing.T, kc kubernetes.Interface, ns, pod string) *gateway {
	t.Helper()
	g := &gateway{clk: testingclock.NewFakeClock(t0), loads: &loads{r: loadreport.Report{}, read: make(chan struct{}, 16)}, done: make(chan struct{})}
	var err error
	g.w, err = loadreport.NewWriter(loadreport.WriterConfig{Leases: kc.CoordinationV1().Leases(ns), Pod: pod,
		Loads: g.loads.get, Clock: g.clk})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g.stop = func() { cancel(); <-g.done }
	go func() { defer close(g.done); _ = g.w.Run(ctx) }()
	t.Cleanup(g.stop)
	// The first write is done once the writer waits on its ticker.
	awaitWaiters(t, g.clk)
	return g
}

// awaitWaiters waits until something waits on clk (the fake clock has no
// event for it, so this polls).
func awaitWaiters(t *testing.T, clk *testingclock.FakeClock) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !clk.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("nothing waits on the clock")
		}
		time.Sleep(time.Millisecond)
	}
}

// annotations follows the record leases of ns and keeps each one's
// annotation values in the order written.
type annotations struct {
	mu      sync.Mutex
	byName  map[string][]string
	changed chan struct{}
}

func followAnnotations(t *testing.T, kc kubernetes.Interface, ns string) *annotations {
	t.Helper()
	w, err := kc.CoordinationV1().Leases(ns).Watch(t.Context(), metav1.ListOptions{LabelSelector: loadreport.Label + "=true"})
	if err != nil {
		t.Fatal(err)
	}
	a := &annotations{byName: map[string][]string{}, changed: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			l, ok := ev.Object.(*coordinationv1.Lease)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
				continue
			}
			a.mu.Lock()
			a.byName[l.Name] = append(a.byName[l.Name], l.Annotations[loadreport.Annotation])
			a.mu.Unlock()
			select {
			case a.changed <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() { w.Stop(); <-done })
	return a
}

// await waits until the record name's last value holds want, and returns
// its values.
func (a *annotations) await(t *testing.T, name, want string) []string {
	t.Helper()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		a.mu.Lock()
		vals := slices.Clone(a.byName[name])
		a.mu.Unlock()
		if len(vals) > 0 && strings.Contains(vals[len(vals)-1], want) {
			return vals
		}
		select {
		case <-a.changed:
		case <-timer.C:
			t.Fatalf("record %s: no value with %q; values %q", name, want, vals)
		}
	}
}

// TestGatewayLoadsReachTheReader: two gateways' records on a real API
// server, summed per Function by the reader, each change poked; a record
// is written only when its loads changed (or for its refresh), at once
// when poked, counted only while fresh, and deleted when its gateway
// stops.
func TestGatewayLoadsReachTheReader(t *testing.T) {
	c := kubetest.Shared(t)
	ns := c.Namespace(t)
	kc, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	rclk := testingclock.NewFakeClock(t0)
	pokes := make(chan string, 64)
	r, err := loadreport.NewReader(loadreport.ReaderConfig{Client: kc, Namespace: ns, Clock: rclk,
		OnChange: func(namespace, name string) { pokes <- namespace + "/" + name }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	readerDone := make(chan struct{})
	go func() { defer close(readerDone); _ = r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-readerDone })
	ann := followAnnotations(t, kc, ns)

	poked := func(want string) {
		t.Helper()
		select {
		case got := <-pokes:
			if got != want {
				t.Fatalf("poked %s, want %s", got, want)
			}
		case <-time.After(bound):
			t.Fatalf("%s was not poked", want)
		}
	}
	load := func(want [2]int) {
		t.Helper()
		if i, q := r.Load("default", "f"); i != want[0] || q != want[1] {
			t.Fatalf("default/f: %d in flight, %d queued; want %v", i, q, want)
		}
	}

	g1, g2 := startGateway(t, kc, ns, "gw-1"), startGateway(t, kc, ns, "gw-2")
	ann.await(t, loadreport.NamePrefix+"gw-1", "{}")
	ann.await(t, loadreport.NamePrefix+"gw-2", "{}")
	load([2]int{0, 0})

	// Each gateway's load, on its period; the reader sums them.
	g1.loads.set(loadreport.Report{"default/f": {InFlight: 2, Queued: 1}})
	g1.clk.Step(time.Second)
	poked("default/f")
	load([2]int{2, 1})
	g2.loads.set(loadreport.Report{"default/f": {InFlight: 1, Queued: 3}})
	g2.clk.Step(time.Second)
	poked("default/f")
	load([2]int{3, 4})

	// No change, no write: three periods pass, then a change is the
	// record's next value.
	for range 3 {
		g1.step(t, time.Second)
	}
	g1.loads.set(loadreport.Report{"default/f": {InFlight: 2, Queued: 2}})
	g1.clk.Step(time.Second)
	poked("default/f")
	vals := ann.await(t, loadreport.NamePrefix+"gw-1", `"q":2`)
	if len(vals) != 3 {
		t.Fatalf("gw-1's record was written %d times, want 3 (created, and two changes): %q", len(vals), vals)
	}

	// A poke writes within UrgentInterval of the last write, not at the
	// next period.
	g1.loads.set(loadreport.Report{"default/f": {InFlight: 2, Queued: 2}, "default/g": {Queued: 1}})
	g1.w.Poke()
	g1.clk.Step(loadreport.DefaultUrgentInterval)
	poked("default/g")
	if i, q := r.Load("default", "g"); i != 0 || q != 1 {
		t.Fatalf("default/g: %d, %d after the poke", i, q)
	}

	// A poke right after a write on the period (not a poke's) writes at
	// once, without the clock moving: UrgentInterval bounds the pokes'
	// writes among themselves, and a scale from zero does not wait for
	// the period's write that came just before it.
	g1.loads.set(loadreport.Report{"default/f": {InFlight: 2, Queued: 2}, "default/g": {Queued: 1}, "default/h": {InFlight: 1}})
	g1.clk.Step(time.Second)
	poked("default/h")
	g1.loads.set(loadreport.Report{"default/f": {InFlight: 2, Queued: 2}, "default/g": {Queued: 1}, "default/h": {InFlight: 1, Queued: 1}})
	g1.w.Poke()
	poked("default/h")
	if i, q := r.Load("default", "h"); i != 1 || q != 1 {
		t.Fatalf("default/h: %d, %d after the poke", i, q)
	}
	g1.loads.set(loadreport.Report{"default/f": {InFlight: 2, Queued: 2}, "default/g": {Queued: 1}})
	g1.clk.Step(time.Second)
	poked("default/h")

	// Records not rewritten within their lease's duration do not count;
	// one with load is refreshed every 10 s and counts again.
	rclk.Step(loadreport.LeaseDuration)
	load([2]int{0, 0})
	g1.clk.Step(10 * time.Second)
	deadline := time.Now().Add(bound)
	for i, _ := r.Load("default", "f"); i != 2; i, _ = r.Load("default", "f") {
		if time.Now().After(deadline) {
			t.Fatal("gw-1's refreshed record does not count")
		}
		time.Sleep(time.Millisecond) // the refresh changes no entry: no poke to await
	}
	load([2]int{2, 2})

	// A stopping gateway deletes its record.
	g1.stop()
	got := map[string]bool{}
	for range 2 {
		select {
		case k := <-pokes:
			got[k] = true
		case <-time.After(bound):
			t.Fatalf("the deleted record poked only %v", got)
		}
	}
	if !got["default/f"] || !got["default/g"] {
		t.Fatalf("the deleted record poked %v, want default/f and default/g", got)
	}
	if _, err := kc.CoordinationV1().Leases(ns).Get(t.Context(), loadreport.NamePrefix+"gw-1", metav1.GetOptions{}); err == nil {
		t.Fatal("gw-1's record is still there after it stopped")
	}
	_ = g2
}
