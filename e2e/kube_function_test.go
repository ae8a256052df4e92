package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/loadreport"
	"stoke.dev/stoke/internal/placement"
	"stoke.dev/stoke/internal/pydeps/pydepstest"
	"stoke.dev/stoke/internal/testbin"
)

// TestKubeFunctions is issue 20's Function on the cluster, as the chart
// installs it (two gateway replicas, the controller's autoscaler): scale
// from zero to a first answer, scale up under load and down after idle
// (each gateway's load record is what the autoscaler sees), two gateways
// sharing a Function's replicas with no call lost or misrouted and never
// two in flight on one registration, and a rolling update under load
// with no failed invocation. There is no fake clock in a cluster: the
// tests await the objects' events (informers), never a sleep.
func TestKubeFunctions(t *testing.T) {
	e := startKube(t)
	g := e.gatewayUsers(t)
	for _, st := range []struct {
		name string
		test func(*testing.T, *kubeEnv, *gatewayUsers)
	}{
		{"ScaleFromZero", testKubeScaleFromZero},
		{"ScaleUpAndDown", testKubeScaleUpAndDown},
		{"TwoGatewaysShareReplicas", testKubeTwoGatewaysShareReplicas},
		{"RollUnderLoad", testKubeRollUnderLoad},
		{"ReplicaPodDeleted", testKubeReplicaPodDeleted},
		{"ReplicaServerKilled", testKubeReplicaServerKilled},
		{"Requirements", testKubeRequirements},
	} {
		t.Run(st.name, func(t *testing.T) { st.test(t, e, g) })
	}
}

// fnHandler records each invocation's start and end in its
// registration's own marker file in MARKS (named after the registration's
// working directory, which is its Run's), sleeps event["sleep"] seconds,
// and answers the call's ID, the registration and $VERSION: a file whose
// lines do not alternate start/end of one call would show two
// invocations in flight on one registration.
const fnHandler = `import os, time

def handle(event, context):
    reg = os.path.basename(os.getcwd())
    path = os.path.join(os.environ["MARKS"], reg)
    with open(path, "a") as f:
        f.write("start %s\n" % event["id"])
    time.sleep(event.get("sleep", 0))
    with open(path, "a") as f:
        f.write("end %s\n" % event["id"])
    return {"id": event["id"], "replica": reg, "version": os.environ.get("VERSION", "")}
`

// kubeFunction is a Function of runsNamespace on the python Runtime
// running fnHandler with its marker files in a directory of its own.
func (e *kubeEnv) kubeFunction(t testing.TB, name string, scale v1alpha1.FunctionScale, env ...v1alpha1.EnvVar) (*v1alpha1.Function, string) {
	t.Helper()
	marks := e.sharedDir(t)
	fn := &v1alpha1.Function{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: runsNamespace},
		Spec: v1alpha1.FunctionSpec{Runtime: "python", Handler: "fn.handle", Scale: scale,
			Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "fn.py", Text: fnHandler}},
			Env:    append([]v1alpha1.EnvVar{{Name: "MARKS", Value: marks}}, env...)}}
	fn.APIVersion, fn.Kind = v1alpha1.GroupVersion.String(), "Function"
	out := &v1alpha1.Function{}
	if err := e.stoke.Post().Namespace(runsNamespace).Resource("functions").Body(fn).Do(context.Background()).Into(out); err != nil {
		t.Fatalf("create function %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = e.stoke.Delete().Namespace(runsNamespace).Resource("functions").Name(name).Do(context.Background()).Error()
	})
	return out, marks
}

// watchFunctions follows the Functions of runsNamespace.
func (e *kubeEnv) watchFunctions(t testing.TB) *objects[*v1alpha1.Function] {
	t.Helper()
	return follow(t, cache.NewListWatchFromClient(e.stoke, "functions", runsNamespace, fields.Everything()), &v1alpha1.Function{})
}

// fnAnswer is one answer of a Function's URL.
type fnAnswer struct {
	gwResult
	ID, Replica, Version string
}

// invokeFn calls the Function name's URL at the gateway base once.
func (g *gatewayUsers) invokeFn(base, name, id string, sleep float64) fnAnswer {
	r := g.call(http.MethodPost, base+"/v1/namespaces/"+runsNamespace+"/functions/"+name+"/invoke", g.editor,
		strings.NewReader(fmt.Sprintf(`{"id":%q,"sleep":%v}`, id, sleep)), map[string]string{"Content-Type": "application/json"})
	a := fnAnswer{gwResult: r}
	if r.status == http.StatusOK {
		var out struct{ ID, Replica, Version string }
		if err := json.Unmarshal([]byte(r.body), &out); err == nil {
			a.ID, a.Replica, a.Version = out.ID, out.Replica, out.Version
		}
	}
	return a
}

// checkMarks reads every registration's marker file in dir: each start
// is followed by its own end; it returns the invocations each ran.
func checkMarks(t *testing.T, dir string) map[string]int {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	ran := map[string]int{}
	for _, ent := range entries {
		lines := marks(t, filepath.Join(dir, ent.Name()))
		for i := 0; i+1 < len(lines); i += 2 {
			id, ok := strings.CutPrefix(lines[i], "start_")
			if !ok || lines[i+1] != "end_"+id {
				t.Fatalf("registration %s: %q then %q: two invocations in flight on one registration", ent.Name(), lines[i], lines[i+1])
			}
		}
		if len(lines)%2 != 0 {
			t.Fatalf("registration %s: an invocation started and never ended: %q", ent.Name(), lines[len(lines)-1])
		}
		ran[ent.Name()] = len(lines) / 2
	}
	return ran
}

// replicasOf counts the replica Runs of Function name that are Ready.
func replicasOf(m map[string]*v1alpha1.Run, name string) (all, ready int) {
	for _, r := range m {
		if r.Labels[v1alpha1.LabelFunction] != name {
			continue
		}
		all++
		if r.Status.Phase == v1alpha1.PhaseReady {
			ready++
		}
	}
	return all, ready
}

// An idle Function with scale.min 0 has no replica; its first invocation
// through a gateway waits in that gateway's queue, its load record pokes
// the autoscaler, a replica is made and registers, and the call is
// answered 200 (not 404); status.lastScale says 0 -> 1.
func testKubeScaleFromZero(t *testing.T, e *kubeEnv, g *gatewayUsers) {
	base := anyGateway(e.gateways(t, 2))
	fns := e.watchFunctions(t)
	defer fns.close()
	runs := e.watchRuns(t, v1alpha1.LabelFunction+"=zero")
	defer runs.close()
	e.kubeFunction(t, "zero", v1alpha1.FunctionScale{Min: 0, Max: 2})
	fns.until(t, runBound, "zero observed with no replica", func(m map[string]*v1alpha1.Function) bool {
		f := m["zero"]
		return f != nil && f.Status.ObservedGeneration == f.Generation && f.Status.Replicas == 0
	})
	if all, _ := replicasOf(runs.until(t, runBound, "listed", func(map[string]*v1alpha1.Run) bool { return true }), "zero"); all != 0 {
		t.Fatalf("an idle min-0 Function has %d replicas", all)
	}
	start := time.Now()
	a := g.invokeFn(base, "zero", "first", 0)
	if a.status != http.StatusOK || a.ID != "first" {
		t.Fatalf("the first invocation of a Function at zero: %s", a)
	}
	t.Logf("scale from zero to the first answer: %v (one run, loaded; not a benchmark)", time.Since(start).Round(time.Millisecond))
	got := fns.until(t, runBound, "zero's lastScale", func(m map[string]*v1alpha1.Function) bool {
		f := m["zero"]
		return f != nil && f.Status.LastScale != nil
	})["zero"]
	if ls := got.Status.LastScale; ls.From != 0 || ls.To != 1 || !strings.Contains(ls.Reason, "queued") {
		t.Errorf("lastScale %+v, want 0 -> 1 for a queued invocation", ls)
	}
}

// Under load from both gateways (more calls at once than one replica
// serves) the autoscaler scales up to max, status.inFlight shows the load
// the gateways report, every call is answered; once the load stops it
// scales down to 0 after idleSeconds.
func testKubeScaleUpAndDown(t *testing.T, e *kubeEnv, g *gatewayUsers) {
	urls := e.gateways(t, 2)
	bases := gatewayBases(urls)
	fns := e.watchFunctions(t)
	defer fns.close()
	_, marksDir := e.kubeFunction(t, "updown", v1alpha1.FunctionScale{Min: 0, Max: 3, IdleSeconds: 2})
	if a := g.invokeFn(bases[0], "updown", "warm", 0); a.status != http.StatusOK {
		t.Fatalf("first call: %s", a)
	}

	const clients = 6
	var stop atomic.Bool
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed []string
	calls := 0
	for c := range clients {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				id := fmt.Sprintf("u%d-%d", c, i)
				a := g.invokeFn(bases[c%len(bases)], "updown", id, 0.3)
				mu.Lock()
				calls++
				if a.status != http.StatusOK || a.ID != id {
					failed = append(failed, id+": "+a.String())
				}
				mu.Unlock()
			}
		})
	}
	up := fns.await
	_, err := up(runBound, func(m map[string]*v1alpha1.Function) bool {
		f := m["updown"]
		return f != nil && f.Status.ReadyReplicas == 3
	})
	stop.Store(true)
	wg.Wait()
	if err != nil {
		t.Fatalf("no scale up to 3 ready replicas under load: %v", err)
	}
	if len(failed) > 0 {
		t.Fatalf("%d of %d calls under load failed: %v", len(failed), calls, failed[:min(len(failed), 5)])
	}
	if _, ok := fns.firstSeen(func(f *v1alpha1.Function) bool { return f.Name == "updown" && f.Status.InFlight+f.Status.Queued > 1 }); !ok {
		t.Error("status.inFlight + status.queued never showed the load (the gateways' records)")
	}
	checkMarks(t, marksDir)

	fn := fns.until(t, 2*runBound, "updown scaled down to 0 after idleSeconds", func(m map[string]*v1alpha1.Function) bool {
		f := m["updown"]
		return f != nil && f.Spec.Replicas != nil && *f.Spec.Replicas == 0 && f.Status.Replicas == 0
	})["updown"]
	if ls := fn.Status.LastScale; ls == nil || ls.To != 0 {
		t.Errorf("lastScale %+v, want a scale down to 0", ls)
	}
	t.Logf("%d calls from %d clients through %d gateways, none failed", calls, clients, len(bases))
}

// Two gateway replicas dispatch over the same two replicas: both answer,
// every call is answered once with its own ID, and no registration ever
// had two invocations in flight (the Runtime Server's refusal, made
// before a call runs, arbitrates between the gateways).
func testKubeTwoGatewaysShareReplicas(t *testing.T, e *kubeEnv, g *gatewayUsers) {
	urls := e.gateways(t, 2)
	fns := e.watchFunctions(t)
	defer fns.close()
	_, marksDir := e.kubeFunction(t, "shared", v1alpha1.FunctionScale{Min: 2, Max: 2})
	fns.until(t, runBound, "shared's 2 replicas ready", func(m map[string]*v1alpha1.Function) bool {
		f := m["shared"]
		return f != nil && f.Status.ReadyReplicas == 2
	})
	const clients, each = 16, 8
	type tally struct{ ok, bad int }
	byGateway := map[string]*tally{}
	for name := range urls {
		byGateway[name] = &tally{}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	names := make([]string, 0, len(urls))
	for name := range urls {
		names = append(names, name)
	}
	var failed []string
	replicas := map[string]int{}
	for c := range clients {
		gw := names[c%len(names)]
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("s%d-%d", c, i)
				a := g.invokeFn(urls[gw], "shared", id, 0.05)
				mu.Lock()
				if a.status == http.StatusOK && a.ID == id {
					byGateway[gw].ok++
					replicas[a.Replica]++
				} else {
					byGateway[gw].bad++
					failed = append(failed, id+" via "+gw+": "+a.String())
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(failed) > 0 {
		t.Fatalf("%d calls failed or were misrouted: %v", len(failed), failed[:min(len(failed), 5)])
	}
	for gw, tl := range byGateway {
		if tl.ok == 0 {
			t.Errorf("gateway %s answered nothing", gw)
		}
	}
	ran := checkMarks(t, marksDir)
	total := 0
	for _, n := range ran {
		total += n
	}
	if total != clients*each {
		t.Errorf("the replicas ran %d invocations, %d were answered (lost or run twice): %v", total, clients*each, ran)
	}
	if len(ran) != 2 || len(replicas) != 2 {
		t.Errorf("calls ran on %v (answers say %v), want both replicas", ran, replicas)
	}
	t.Logf("%d calls through %d gateways: by replica %v", clients*each, len(urls), replicas)
}

// A template change while clients call through both gateways rolls the
// replicas (new ones Ready before the old drain): no call fails, and the
// answers move to the new version.
func testKubeRollUnderLoad(t *testing.T, e *kubeEnv, g *gatewayUsers) {
	urls := e.gateways(t, 2)
	bases := gatewayBases(urls)
	fns := e.watchFunctions(t)
	defer fns.close()
	e.kubeFunction(t, "roll", v1alpha1.FunctionScale{Min: 2, Max: 2}, v1alpha1.EnvVar{Name: "VERSION", Value: "v1"})
	fns.until(t, runBound, "roll's 2 replicas ready", func(m map[string]*v1alpha1.Function) bool {
		f := m["roll"]
		return f != nil && f.Status.ReadyReplicas == 2
	})
	const clients = 6
	var stop atomic.Bool
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed []string
	versions := map[string]int{}
	sawV1, sawV2 := make(chan struct{}), make(chan struct{})
	var once1, once2 sync.Once
	for c := range clients {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				id := fmt.Sprintf("r%d-%d", c, i)
				a := g.invokeFn(bases[c%len(bases)], "roll", id, 0.02)
				mu.Lock()
				if a.status != http.StatusOK || a.ID != id {
					failed = append(failed, id+": "+a.String())
				} else {
					versions[a.Version]++
					if a.Version == "v1" {
						once1.Do(func() { close(sawV1) })
					}
					if a.Version == "v2" && versions["v2"] >= 3*clients {
						once2.Do(func() { close(sawV2) })
					}
				}
				mu.Unlock()
			}
		})
	}
	// Some calls on v1 first, then the change.
	select {
	case <-sawV1:
	case <-time.After(runBound):
		stop.Store(true)
		wg.Wait()
		t.Fatalf("no call answered by v1: %v", failed[:min(len(failed), 5)])
	}
	cur := &v1alpha1.Function{}
	if err := e.stoke.Get().Namespace(runsNamespace).Resource("functions").Name("roll").Do(context.Background()).Into(cur); err != nil {
		t.Fatal(err)
	}
	for i := range cur.Spec.Env {
		if cur.Spec.Env[i].Name == "VERSION" {
			cur.Spec.Env[i].Value = "v2"
		}
	}
	if err := e.stoke.Put().Namespace(runsNamespace).Resource("functions").Name("roll").Body(cur).Do(context.Background()).Error(); err != nil {
		t.Fatal(err)
	}
	_, err := fns.await(2*runBound, func(m map[string]*v1alpha1.Function) bool {
		f := m["roll"]
		return f != nil && f.Status.ObservedGeneration == f.Generation && f.Status.UpdatedReplicas == 2 && f.Status.Replicas == 2 && f.Status.ReadyReplicas == 2
	})
	if err == nil {
		select {
		case <-sawV2:
		case <-time.After(runBound):
			err = fmt.Errorf("the answers did not move to v2")
		}
	}
	stop.Store(true)
	wg.Wait()
	if err != nil {
		t.Fatalf("the roll did not finish: %v", err)
	}
	if len(failed) > 0 {
		t.Fatalf("%d calls failed during the roll: %v", len(failed), failed[:min(len(failed), 5)])
	}
	t.Logf("calls during the roll by version: %v, none failed", versions)
}

// benchScaleFromZero is BenchmarkKube/ScaleFromZero, issue 20's scale from
// zero to the first answer on the cluster, beside standalone's
// BenchmarkUpScaleFromZero: each iteration creates a Python Function with
// scale.min 0 (no replica), then times its first invocation through a
// gateway, from the request to the answer (the gateway queues it and
// writes its load record at once, the controller's autoscaler asks for a
// replica, the Function controller creates it, the scheduler puts it on a
// warm Pod, it registers, the gateway's informer sees it Ready and hands
// it the call). Beside it, in the same run: the Function's second (warm)
// invocation, and how long after the create the gateway first knew the
// Function's URL (404 until then, counted apart).
func benchScaleFromZero(b *testing.B, e *kubeEnv, g *gatewayUsers) {
	base := anyGateway(e.gateways(b, 2))
	round := benchRound.Add(1)
	runs := e.watchRuns(b, "")
	defer runs.close()
	var first, warm, known []time.Duration
	// Where the first answer's time goes, from this test's watch of the
	// Runs (its own informer: each step as seen here): the call's start to
	// the replica Run's create, to its Ready, to the answer.
	var toCreate, toReady, toAnswer []time.Duration
	// Within the replica's way to Ready: its assignment (the scheduler's
	// Scheduled write, or, for a replica placed at its create, runtimed's
	// one write of the assignment, the claim and Ready), runtimed's
	// Running claim, and runtimed's finalizer (its
	// registration, a Python worker started and the handler imported,
	// then its Ready write, is the rest).
	var toScheduled, toRunning, toFinalizer, runningToReady []time.Duration
	fns := e.watchFunctions(b)
	defer fns.close()
	var toScale []time.Duration
	// Within step 1: the gateway's load record (a Lease per gateway,
	// internal/loadreport) as the gateway stamps its write (renewTime,
	// the same machine's clock) and as this test's watch sees it, then
	// the controller's autoscaler's spec.replicas.
	leases := e.watchLeases(b, stokeNamespace)
	defer leases.close()
	var toLeaseWrite, toLeaseSeen, leaseToScale, leaseToCreate []time.Duration
	// A Function scaled to zero has been idle, so its pods' spare Python
	// workers have been made again since the last registration took one:
	// before each create, outside the timed part, wait for them
	// (testbin.AwaitPythonSparesIdle; the runtime Pods' processes are this
	// test's, through the node agent), and report the wait beside.
	var spareWait []time.Duration
	// Within step 3, on the replica's Pod, from its runtimed's "function
	// ready" log line (runtimed's clock, the same machine's): the
	// Scheduled write as this test's watch saw it → runtimed took the Run
	// (its own Run watch), → its registration known Ready, → its Ready
	// write began (with the claim, or after the claim alone landed), → the
	// write returned (the line), → this test's watch saw Ready.
	var toTook, tookToRegistered, registeredToWrite, writeToWritten, writtenToSeen, scheduledToReady []time.Duration
	oneWrite := 0
	// Replicas placed at their create whose first assigned state was
	// runtimed's one write (assigned, claimed and Ready: no Scheduled
	// write before it; internal/placement), of those seen assigned.
	placedTaken, assignedSeen := 0, 0
	// The writes this test's watches saw between the call and its answer
	// (sfzWindow), and the API server's own count of every write over
	// the benchmark (one scrape each side, outside the timed part): which
	// writes beside the path share the API server with it.
	window := windowWrites{}
	b.StopTimer()
	apiBefore := e.apiWrites(b)
	b.StartTimer()
	for i := range b.N {
		waited, err := testbin.AwaitPythonSparesIdle(os.Getpid(), runBound)
		if err != nil {
			b.Fatal(err)
		}
		spareWait = append(spareWait, waited)
		name := fmt.Sprintf("zero%d-%d", round, i)
		fn := &v1alpha1.Function{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: runsNamespace},
			Spec: v1alpha1.FunctionSpec{Runtime: "python", Handler: "fn.handle", Scale: v1alpha1.FunctionScale{Min: 0, Max: 1},
				Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "fn.py", Text: "def handle(event, context):\n    return event\n"}}}}
		fn.APIVersion, fn.Kind = v1alpha1.GroupVersion.String(), "Function"
		if err := e.stoke.Post().Namespace(runsNamespace).Resource("functions").Body(fn).Do(context.Background()).Error(); err != nil {
			b.Fatal(err)
		}
		created := time.Now()
		url := base + "/v1/namespaces/" + runsNamespace + "/functions/" + name + "/invoke"
		json := map[string]string{"Content-Type": "application/json"}
		for _, into := range []*[]time.Duration{&first, &warm} {
			var start time.Time
			var r gwResult
			for {
				start = time.Now()
				r = g.call(http.MethodPost, url, g.editor, strings.NewReader(`{"i":1}`), json)
				if r.status != http.StatusNotFound || time.Since(created) > runBound {
					break
				}
				time.Sleep(time.Millisecond) // no event of the gateway's informer to await from here
			}
			if r.status != http.StatusOK {
				b.Fatalf("invoke %s: %s", name, r)
			}
			if into == &first {
				known = append(known, start.Sub(created))
				answered := time.Now()
				window.add(sfzWindow(runs, fns, leases, name, start, answered))
				replica := func(r *v1alpha1.Run) bool { return r.Labels[v1alpha1.LabelFunction] == name }
				made, ok1 := runs.firstSeen(replica)
				ready, ok2 := runs.firstSeen(func(r *v1alpha1.Run) bool { return replica(r) && r.Status.Phase == v1alpha1.PhaseReady })
				scaled, ok3 := fns.firstSeen(func(f *v1alpha1.Function) bool {
					return f.Name == name && f.Spec.Replicas != nil && *f.Spec.Replicas == 1
				})
				key := strconv.Quote(loadreport.Key(runsNamespace, name))
				loaded := func(l *coordinationv1.Lease) bool {
					return l.Labels[loadreport.Label] == "true" && strings.Contains(l.Annotations[loadreport.Annotation], key) &&
						l.Spec.RenewTime != nil && !l.Spec.RenewTime.Before(&metav1.MicroTime{Time: start})
				}
				if l, seen, ok := leases.first(loaded); ok && ok3 {
					written := l.Spec.RenewTime.Time
					toLeaseWrite, toLeaseSeen = append(toLeaseWrite, written.Sub(start)), append(toLeaseSeen, seen.Sub(written))
					leaseToScale = append(leaseToScale, scaled.Sub(seen))
					if ok1 {
						// The Function controller makes the replica as the
						// autoscaler's write starts, not once it is seen.
						leaseToCreate = append(leaseToCreate, made.Sub(seen))
					}
				}
				if ok1 && ok2 && ok3 {
					toScale = append(toScale, scaled.Sub(start))
					toCreate, toReady = append(toCreate, made.Sub(scaled)), append(toReady, ready.Sub(made))
					toAnswer = append(toAnswer, answered.Sub(ready))
				}
				scheduled, ok4 := runs.firstSeen(func(r *v1alpha1.Run) bool { return replica(r) && r.Status.AssignedPodUID != "" })
				running, ok5 := runs.firstSeen(func(r *v1alpha1.Run) bool {
					return replica(r) && (r.Status.Phase == v1alpha1.PhaseRunning || r.Status.Phase == v1alpha1.PhaseReady)
				})
				finalized, ok6 := runs.firstSeen(func(r *v1alpha1.Run) bool {
					return replica(r) && slices.Contains(r.Finalizers, v1alpha1.FinalizerRuntimed)
				})
				if ok1 && ok2 && ok4 && ok5 && ok6 {
					toScheduled, toRunning = append(toScheduled, scheduled.Sub(made)), append(toRunning, running.Sub(scheduled))
					toFinalizer, runningToReady = append(toFinalizer, finalized.Sub(running)), append(runningToReady, ready.Sub(running))
				}
			}
			*into = append(*into, time.Since(start))
		}
		b.StopTimer()
		replica, _, seenAssigned := runs.first(func(r *v1alpha1.Run) bool {
			return r.Labels[v1alpha1.LabelFunction] == name && r.Status.AssignedPod != ""
		})
		if seenAssigned {
			assignedSeen++
			if placement.Marked(replica) && replica.Status.Phase == v1alpha1.PhaseReady {
				placedTaken++
			}
		}
		scheduled, ok1 := runs.firstSeen(func(r *v1alpha1.Run) bool {
			return r.Labels[v1alpha1.LabelFunction] == name && r.Status.AssignedPodUID != ""
		})
		ready, ok2 := runs.firstSeen(func(r *v1alpha1.Run) bool {
			return r.Labels[v1alpha1.LabelFunction] == name && r.Status.Phase == v1alpha1.PhaseReady
		})
		if l, ok := e.runtimedReadyLine(replica); ok && ok1 && ok2 {
			toTook, tookToRegistered = append(toTook, l.Took.Sub(scheduled)), append(tookToRegistered, l.Registered.Sub(l.Took))
			registeredToWrite, writeToWritten = append(registeredToWrite, l.Wrote.Sub(l.Registered)), append(writeToWritten, l.Time.Sub(l.Wrote))
			writtenToSeen, scheduledToReady = append(writtenToSeen, ready.Sub(l.Time)), append(scheduledToReady, ready.Sub(scheduled))
			if l.WithClaim {
				oneWrite++
			}
		}
		if err := e.stoke.Delete().Namespace(runsNamespace).Resource("functions").Name(name).Do(context.Background()).Error(); err != nil {
			b.Fatal(err)
		}
		runs.until(b, runBound, name+"'s replica gone", func(m map[string]*v1alpha1.Run) bool {
			all, _ := replicasOf(m, name)
			return all == 0
		})
		b.StartTimer()
	}
	b.StopTimer()
	apiWrites := e.apiWrites(b).minus(apiBefore)
	b.ReportMetric(float64(window.total())/float64(b.N), "window-writes/op")
	b.Logf("writes seen between the call and its answer, per scale from zero (%d): %s", b.N, window.per(b.N))
	b.ReportMetric(apiWrites["functions/status PUT"]/float64(b.N), "function-status-writes/op")
	b.Logf("API server writes per scale from zero (%d, the whole iteration: the Function's create and delete too, and every other writer's): %s",
		b.N, apiWrites.per(float64(b.N), nil))
	reportPercentilesAs(b, first, "first")
	reportPercentilesAs(b, warm, "warm")
	reportPercentilesAs(b, known, "url-known-after-create")
	reportPercentilesAs(b, spareWait, "spare-wait")
	// The steps (a watch's view lags each by its own delivery).
	reportPercentilesAs(b, toScale, "step1-call-to-spec.replicas")
	reportPercentilesAs(b, toLeaseWrite, "step1a-call-to-load-record-written")
	reportPercentilesAs(b, toLeaseSeen, "step1b-load-record-written-to-seen")
	reportPercentilesAs(b, leaseToScale, "step1c-load-record-seen-to-spec.replicas")
	reportPercentilesAs(b, leaseToCreate, "step1d-load-record-seen-to-replica-created")
	reportPercentilesAs(b, toCreate, "step2-to-replica-created")
	reportPercentilesAs(b, toReady, "step3-to-replica-ready")
	reportPercentilesAs(b, toAnswer, "step4-to-answer")
	reportPercentilesAs(b, toScheduled, "step3a-created-to-scheduled")
	reportPercentilesAs(b, toRunning, "step3b-scheduled-to-running")
	reportPercentilesAs(b, toFinalizer, "step3c-running-to-finalizer")
	reportPercentilesAs(b, runningToReady, "step3d-running-to-ready")
	reportPercentilesAs(b, scheduledToReady, "step3bd-scheduled-to-ready")
	reportPercentilesAs(b, toTook, "step3e-scheduled-seen-to-runtimed-took")
	reportPercentilesAs(b, tookToRegistered, "step3f-took-to-registered")
	reportPercentilesAs(b, registeredToWrite, "step3g-registered-to-ready-write")
	reportPercentilesAs(b, writeToWritten, "step3h-ready-write")
	reportPercentilesAs(b, writtenToSeen, "step3i-ready-written-to-seen")
	if len(toTook) > 0 {
		b.ReportMetric(float64(oneWrite)/float64(len(toTook)), "claim-with-ready-share")
	}
	if assignedSeen > 0 {
		b.ReportMetric(float64(placedTaken)/float64(assignedSeen), "placed-share")
	}
}

// sfzWindow is the writes this test's watches saw in (from, to] of the
// Function name (its spec and its status), its replica Runs (by the
// phase each write shows) and the gateways' load records.
func sfzWindow(runs *objects[*v1alpha1.Run], fns *objects[*v1alpha1.Function], leases *objects[*coordinationv1.Lease], name string, from, to time.Time) windowWrites {
	in := func(at time.Time) bool { return at.After(from) && !at.After(to) }
	w := windowWrites{}
	fns.mu.Lock()
	gen := int64(-1)
	for _, s := range fns.history {
		if s.obj.Name != name {
			continue
		}
		if in(s.at) {
			if s.obj.Generation != gen {
				w["function spec"]++
			} else {
				w["function status"]++
			}
		}
		gen = s.obj.Generation
	}
	fns.mu.Unlock()
	runs.mu.Lock()
	known := map[string]bool{}
	for _, s := range runs.history {
		if s.obj.Labels[v1alpha1.LabelFunction] != name {
			continue
		}
		first := !known[s.obj.Name]
		known[s.obj.Name] = true
		if !in(s.at) {
			continue
		}
		switch ph := s.obj.Status.Phase; {
		case first:
			w["replica create"]++
		case ph == "":
			w["replica (no phase)"]++
		default:
			w["replica "+string(ph)]++
		}
	}
	runs.mu.Unlock()
	leases.mu.Lock()
	for _, s := range leases.history {
		if s.obj.Labels[loadreport.Label] == "true" && in(s.at) {
			w["load record"]++
		}
	}
	leases.mu.Unlock()
	return w
}

// runtimedReadyLine is the "function ready" line of run's runtimed (the
// container log of the Pod it is assigned to), with the times runtimed
// logs beside it.
type runtimedReadyLine struct {
	Time       time.Time `json:"time"`
	Msg        string    `json:"msg"`
	Run        string    `json:"run"`
	Took       time.Time `json:"took"`
	Registered time.Time `json:"registered"`
	Wrote      time.Time `json:"wrote"`
	WithClaim  bool      `json:"with_claim"`
}

func (e *kubeEnv) runtimedReadyLine(run *v1alpha1.Run) (runtimedReadyLine, bool) {
	if run == nil {
		return runtimedReadyLine{}, false
	}
	want := run.Namespace + "/" + run.Name
	var found runtimedReadyLine
	ok := false
	e.runtimedLines(run.Namespace, run.Status.AssignedPod, "function ready", func(line []byte) bool {
		var l runtimedReadyLine
		if !strings.Contains(string(line), want) || json.Unmarshal(line, &l) != nil || l.Msg != "function ready" || l.Run != want || l.Took.IsZero() {
			return true
		}
		found, ok = l, true
		return false
	})
	return found, ok
}

// A python Runtime's Pods install a Function's requirements.txt into
// their own cache (--python-deps in the workspace volume), with pip's
// index settings from the Runtime template's env (offline here: a wheel
// directory this test built), and the handler imports the package.
func testKubeRequirements(t *testing.T, e *kubeEnv, g *gatewayUsers) {
	wheels := e.sharedDir(t)
	if _, err := pydepstest.Wheel(wheels, "stoketiny", "1.0", "VALUE = 42\n"); err != nil {
		t.Fatal(err)
	}
	rt := &v1alpha1.Runtime{ObjectMeta: metav1.ObjectMeta{Name: "py-deps", Namespace: runsNamespace},
		Spec: v1alpha1.RuntimeSpec{Server: "python", Replicas: 1, Runs: 2, Template: &v1alpha1.RuntimeTemplate{
			Env: []corev1.EnvVar{{Name: "PIP_NO_INDEX", Value: "1"}, {Name: "PIP_FIND_LINKS", Value: wheels}}}}}
	rt.APIVersion, rt.Kind = v1alpha1.GroupVersion.String(), "Runtime"
	if err := e.stoke.Post().Namespace(runsNamespace).Resource("runtimes").Body(rt).Do(context.Background()).Error(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.stoke.Delete().Namespace(runsNamespace).Resource("runtimes").Name(rt.Name).Do(context.Background()).Error()
	})
	e.awaitRuntimesReady(t, installBound)

	fn := &v1alpha1.Function{ObjectMeta: metav1.ObjectMeta{Name: "withdeps", Namespace: runsNamespace},
		Spec: v1alpha1.FunctionSpec{Runtime: rt.Name, Handler: "fn.handle", Scale: v1alpha1.FunctionScale{Min: 1, Max: 1},
			Source: &v1alpha1.Source{Archive: &v1alpha1.ArchiveSource{TarGz: tarGzOf(t, map[string]string{
				"fn.py":            "import stoketiny\n\ndef handle(event, context):\n    return {\"value\": stoketiny.VALUE}\n",
				"requirements.txt": "stoketiny==1.0\n",
			})}}}}
	fn.APIVersion, fn.Kind = v1alpha1.GroupVersion.String(), "Function"
	if err := e.stoke.Post().Namespace(runsNamespace).Resource("functions").Body(fn).Do(context.Background()).Error(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.stoke.Delete().Namespace(runsNamespace).Resource("functions").Name(fn.Name).Do(context.Background()).Error()
	})
	fns := e.watchFunctions(t)
	defer fns.close()
	got := fns.until(t, 2*runBound, "withdeps ready (or its replica failing)", func(m map[string]*v1alpha1.Function) bool {
		f := m["withdeps"]
		if f == nil {
			return false
		}
		for _, c := range f.Status.Conditions {
			if c.Type == "ReplicaFailure" && c.Status == metav1.ConditionTrue {
				return true
			}
		}
		return f.Status.ReadyReplicas == 1
	})["withdeps"]
	if got.Status.ReadyReplicas != 1 {
		t.Fatalf("withdeps has no ready replica: %+v", got.Status.Conditions)
	}
	r := g.call(http.MethodPost, anyGateway(e.gateways(t, 2))+"/v1/namespaces/"+runsNamespace+"/functions/withdeps/invoke", g.editor,
		strings.NewReader(`{}`), map[string]string{"Content-Type": "application/json"})
	if r.status != http.StatusOK || !strings.Contains(strings.ReplaceAll(r.body, " ", ""), `{"value":42}`) {
		t.Fatalf("invoke withdeps: %s, want the installed package's value", r)
	}
}

// tarGzOf is a gzipped tar of files (name → content).
func tarGzOf(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for name, text := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(text)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(text)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
