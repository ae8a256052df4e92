package e2e

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/workflow"
)

// benchKubeWorkflowFanOut is BenchmarkKube/WorkflowFanOut100, the
// Kubernetes twin of BenchmarkUpWorkflowFanOut100: a WorkflowRun of 100
// `true` job instances (start, fanning out to a matrix of 98, which end
// needs all of; a WorkflowRun holds at most 64 jobs) on the bench Runtime
// (two Pods of 16 slots), from its creation to the watch seeing it
// Succeeded; and the edge latency, from the end of a job's last need (its
// step Run seen Succeeded) to its own start (its step Run seen created),
// over the 99 with needs; beside it, the same to each dependant's step
// Run seen Running (edge-running: its placement and claim included), the
// writes the watches saw in the median edge's window, and the API
// server's writes to Runs per step Run meanwhile (run-writes/step,
// deletions left out), with the step Runs' phase gaps in the log, and
// their way on their Pods stage by stage (stepTrace). The floors beside
// it, in the same run: one
// `true` task Run, create to Succeeded; and the API server's own cost of
// a fan-out's creates (heldCreates), the edge with nothing but the
// creates. With -kube-pprof DIR every stoke
// process is profiled over the first operation (its first
// -kube-pprof-seconds).
func benchKubeWorkflowFanOut(b *testing.B, e *kubeEnv) {
	vals := make([]string, 98)
	for k := range vals {
		vals[k] = fmt.Sprint(k)
	}
	var jobs strings.Builder
	fmt.Fprintf(&jobs, "  - {id: start, runsOn: %s, steps: [{run: \"true\"}]}\n", benchRuntime)
	fmt.Fprintf(&jobs, "  - {id: mid, needs: [start], runsOn: %s, strategy: {matrix: {axes: [{name: k, values: [%s]}]}}, steps: [{run: \"true\"}]}\n", benchRuntime, strings.Join(vals, ", "))
	fmt.Fprintf(&jobs, "  - {id: end, needs: [mid], runsOn: %s, steps: [{run: \"true\"}]}\n", benchRuntime)
	round := benchRound.Add(1)
	wfs := e.watchWorkflowRuns(b)
	var total, edges, running, reactions, floor, creates []time.Duration
	window := windowWrites{}
	var writes writeCounts
	var trace stepTrace
	var times apiTimes
	for i := range b.N {
		label := fmt.Sprintf("wf%d-%d", round, i)
		tasks := e.watchRuns(b, "e2e="+label)
		start := time.Now()
		e.mustCreateRun(b, labelled(newRun(label+"-true", trueTask()), label))
		tasks.until(b, runBound, "the floor task Succeeded", func(m map[string]*v1alpha1.Run) bool {
			return phaseOf(m, label+"-true") == v1alpha1.PhaseSucceeded
		})
		floor = append(floor, time.Since(start))
		creates = append(creates, e.heldCreates(b, tasks, label, len(vals))...)
		tasks.close()

		steps := e.watchRuns(b, workflow.LabelWorkflowRun+"="+label)
		profiled := func() {}
		if *kubePprof != "" && i == 0 {
			profiled = e.profileAll(b, filepath.Join(*kubePprof, label), *kubePprofSeconds)
		}
		fams := e.apiMetrics(b)
		before, beforeTimes := writesOf(b, fams), timesOf(fams)
		start = time.Now()
		e.mustCreateWorkflowRun(b, fmt.Sprintf("metadata: {name: %s}\nspec:\n  jobs:\n%s", label, jobs.String()))
		wf := wfs.until(b, 3*runBound, label+" ends", func(m map[string]*v1alpha1.WorkflowRun) bool {
			wf := m[label]
			return wf != nil && wf.Status.Phase.Terminal()
		})[label]
		total = append(total, time.Since(start))
		fams = e.apiMetrics(b)
		writes.add(writesOf(b, fams).minus(before))
		times.add(timesOf(fams).minus(beforeTimes))
		if wf.Status.Phase != v1alpha1.WorkflowSucceeded {
			b.Fatalf("%s: %s\n%s", label, wf.Status.Phase, workflowText(wf))
		}
		profiled()
		f := stepEdges(b, steps)
		b.Logf("%s's step Runs as the watch saw them: %s", label, phaseGaps(steps))
		edges, running, reactions = append(edges, f.edges...), append(running, f.running...), append(reactions, f.first)
		b.Logf("%s: the mid step Runs seen created, after start's end: %s; seen Running: %s; the held creates, after the first sent: %s",
			label, curve(f.edges[:len(f.edges)-1]), curve(f.running[:len(f.running)-1]), curve(creates[len(creates)-len(vals):]))
		w := countWindow(steps, wfs, label, f.from, f.to)
		b.Logf("%s: writes seen from start's end to the median mid step Run's creation (%.1f ms): %s", label, float64(f.to.Sub(f.from))/float64(time.Millisecond), w)
		window.add(w)
		trace.add(b, e, steps)
		steps.close()
		e.deleteWorkflowRuns(b, label)
		e.deleteLabelled(b, label)
	}
	reportPercentilesAs(b, total, "create-to-succeeded")
	reportPercentilesAs(b, edges, "edge")
	reportPercentilesAs(b, running, "edge-running")
	reportPercentilesAs(b, reactions, "edge-first")
	reportPercentilesAs(b, floor, "one-task-floor")
	reportPercentilesAs(b, creates, "create-floor")
	b.ReportMetric(float64(window.total())/float64(b.N), "window-writes/op")
	b.Logf("writes seen in the window, per WorkflowRun (%d): %s", b.N, window.per(b.N))
	steps := float64(100 * b.N)
	// Deletions are left out: the previous operation's step Runs are
	// deleted (by the garbage collector) while this one runs.
	b.ReportMetric((writes.resource("runs")-writes["runs DELETE"])/steps, "run-writes/step")
	b.Logf("API server writes per step Run, from the WorkflowRun's creation to its end (%d step Runs, all clients): %s", int(steps), writes.per(steps, workflowWrites))
	trace.report(b)
	b.Logf("the API server's mean time per request, from the WorkflowRun's creation to its end (all clients): %s; flow control now: %s", times, flowLimits(e.apiMetrics(b), times))
	b.ReportMetric(0, "ns/op")
}

// workflowWrites says who makes each kind of write in
// BenchmarkKube/WorkflowFanOut100 while the WorkflowRun runs.
var workflowWrites = map[string]string{
	"runs POST":                 "the workflow controller's step Runs",
	"runs DELETE":               "the previous operation's step Runs, deleted with their WorkflowRun",
	"runs/status PUT":           "step Run status: the scheduler's Scheduled; runtimed's Running (a step past 100 ms, or claimed first) and end",
	"workflowruns/status PUT":   "the workflow controller's WorkflowRun status",
	"workflowruns/status PATCH": "the workflow controller's WorkflowRun status",
	"leases PUT":                "Lease renewals",
	"runtimes/status PATCH":     "the controller's Runtime status",
	"pods/status PATCH":         "the node agents' Pod status",
	"events POST":               "Events",
}

// heldCreates is the edge's floor: n held `true` task Runs (spec.held,
// which the scheduler leaves alone, so nothing else writes meanwhile)
// created as the workflow controller creates a decision's step Runs
// (createWorkers in flight), each one's latency from the first create
// sent to the watch seeing it, as stepEdges times a dependant's start.
// They are deleted before it returns.
func (e *kubeEnv) heldCreates(b *testing.B, tasks *objects[*v1alpha1.Run], label string, n int) []time.Duration {
	b.Helper()
	const createWorkers = 32 // internal/workflow's, for the same load
	names := make([]string, n)
	g := errgroup.Group{}
	g.SetLimit(createWorkers)
	start := time.Now()
	for k := range names {
		names[k] = fmt.Sprintf("%s-held-%d", label, k)
		run := labelled(newRun(names[k], trueTask()), label)
		run.Spec.Held = true
		g.Go(func() error {
			_, err := e.createRun(context.Background(), run)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	tasks.until(b, runBound, "the held Runs seen", func(m map[string]*v1alpha1.Run) bool {
		for _, name := range names {
			if m[name] == nil {
				return false
			}
		}
		return true
	})
	out := make([]time.Duration, 0, n)
	for _, name := range names {
		at, _ := tasks.firstSeen(func(r *v1alpha1.Run) bool { return r.Name == name })
		out = append(out, at.Sub(start))
	}
	e.deleteLabelled(b, label)
	tasks.until(b, runBound, "the held Runs gone", func(m map[string]*v1alpha1.Run) bool {
		for _, name := range names {
			if m[name] != nil {
				return false
			}
		}
		return true
	})
	return out
}

// stepEdges are the edge latencies of one fan-out WorkflowRun from its
// step Runs as the watch saw them (fanOut).
func stepEdges(b *testing.B, steps *objects[*v1alpha1.Run]) fanOut {
	b.Helper()
	seen := func(name string, phase func(v1alpha1.Phase) bool) time.Time {
		at, ok := steps.firstSeen(func(r *v1alpha1.Run) bool { return r.Name == name && phase(r.Status.Phase) })
		if !ok {
			b.Fatalf("step Run %s was never seen so", name)
		}
		return at
	}
	created := func(v1alpha1.Phase) bool { return true }
	succeeded := func(p v1alpha1.Phase) bool { return p == v1alpha1.PhaseSucceeded }
	// Running, or ended: the watch may see a short step's end alone.
	running := func(p v1alpha1.Phase) bool { return p == v1alpha1.PhaseRunning || p.Terminal() }
	var startDone, lastMid, endBegin, endRunning time.Time
	var mids, midsRunning []time.Time
	for name, r := range steps.snapshot() {
		switch r.Labels[workflow.LabelJob] {
		case "start":
			startDone = seen(name, succeeded)
		case "end":
			endBegin, endRunning = seen(name, created), seen(name, running)
		default:
			mids, midsRunning = append(mids, seen(name, created)), append(midsRunning, seen(name, running))
			if d := seen(name, succeeded); d.After(lastMid) {
				lastMid = d
			}
		}
	}
	if len(mids) != 98 {
		b.Fatalf("%d mid step Runs seen, want 98", len(mids))
	}
	var f fanOut
	f.first = mids[0].Sub(startDone)
	for k, t := range mids {
		f.edges = append(f.edges, t.Sub(startDone))
		f.running = append(f.running, midsRunning[k].Sub(startDone))
		f.first = min(f.first, t.Sub(startDone))
	}
	f.edges, f.running = append(f.edges, endBegin.Sub(lastMid)), append(f.running, endRunning.Sub(lastMid))
	slices.SortFunc(mids, func(a, b time.Time) int { return a.Compare(b) })
	f.from, f.to = startDone, mids[len(mids)/2]
	return f
}

// fanOut is what stepEdges measures of one WorkflowRun.
type fanOut struct {
	// edges: each mid instance's step Run seen created after start's
	// step Run seen Succeeded, and end's after the last mid instance's
	// (the edge: a job's end to its dependant's start); running:
	// the same to each dependant's step Run seen Running (a stricter
	// reading: its placement and runtimed's claim included).
	edges, running []time.Duration
	// first is the first mid instance's edge: the controller's reaction
	// to start's end, before the creates' own time.
	first time.Duration
	// from and to are the median mid edge's window: start's end, and
	// the median mid instance's creation.
	from, to time.Time
}

// curve is the 10th, 25th, 50th, 75th and 90th percentiles and the last
// of d, in ms: how a burst of creates arrived.
func curve(d []time.Duration) string {
	d = slices.Sorted(slices.Values(d))
	var parts []string
	for _, q := range []float64{0.1, 0.25, 0.5, 0.75, 0.9, 1} {
		parts = append(parts, fmt.Sprintf("%.0f", float64(d[min(len(d)-1, int(q*float64(len(d))))])/float64(time.Millisecond)))
	}
	return strings.Join(parts, "/")
}

// windowWrites counts the writes the benchmark's watches saw in a window,
// by kind: each watch event is one write through the API server.
type windowWrites map[string]int

// countWindow is the writes seen in (from, to]: of the WorkflowRun's step
// Runs (each one's first event is its create; later ones are named by the
// phase they wrote: the scheduler's Scheduled, runtimed's Running, the
// end) and of the WorkflowRun itself (its status writes).
func countWindow(steps *objects[*v1alpha1.Run], wfs *objects[*v1alpha1.WorkflowRun], name string, from, to time.Time) windowWrites {
	in := func(at time.Time) bool { return at.After(from) && !at.After(to) }
	w := windowWrites{}
	steps.mu.Lock()
	known := map[string]bool{}
	for _, s := range steps.history {
		first := !known[s.obj.Name]
		known[s.obj.Name] = true
		if !in(s.at) {
			continue
		}
		switch ph := s.obj.Status.Phase; {
		case first:
			w["run create"]++
		case ph == v1alpha1.PhaseScheduled:
			w["run Scheduled"]++
		case ph == v1alpha1.PhaseRunning:
			w["run Running"]++
		case ph.Terminal():
			w["run end"]++
		default:
			w["run other ("+string(ph)+")"]++
		}
	}
	steps.mu.Unlock()
	wfs.mu.Lock()
	for _, s := range wfs.history {
		if s.obj.Name == name && in(s.at) {
			w["workflowrun status"]++
		}
	}
	wfs.mu.Unlock()
	return w
}

func (w windowWrites) add(o windowWrites) {
	for k, v := range o {
		w[k] += v
	}
}

func (w windowWrites) total() int {
	t := 0
	for _, v := range w {
		t += v
	}
	return t
}

func (w windowWrites) String() string { return w.per(1) }

// per is the counts divided by n, by kind in a stable order.
func (w windowWrites) per(n int) string {
	keys := slices.Sorted(maps.Keys(w))
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.1f", k, float64(w[k])/float64(n)))
	}
	return strings.Join(parts, ", ")
}

// snapshot is the objects now, by name.
func (o *objects[T]) snapshot() map[string]T {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := make(map[string]T, len(o.byName))
	for k, v := range o.byName {
		m[k] = v
	}
	return m
}
