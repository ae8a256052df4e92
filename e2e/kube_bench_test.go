package e2e

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/scheduler"
	"stoke.dev/stoke/internal/store/kube"
)

// kubeTasks is how many tasks BenchmarkKube/Throughput creates per
// operation: the figure is for 1,000; a smaller number checks the
// benchmark quickly.
var kubeTasks = flag.Int("kube-tasks", 1000, "tasks per operation of BenchmarkKube/Throughput")

// benchRound numbers the calls of a sub-benchmark's function (the testing
// package calls it once with b.N = 1 before the real run), so that each
// call's Run names and labels are new.
var benchRound atomic.Int64

// Bench sizes.
const (
	benchConcurrency = 32 // concurrent creations in Throughput
	benchRuntime     = "bench-bash"
)

// BenchmarkKube measures the figures on one cluster with Stoke
// installed from the Helm chart with its default values (startKubeWith: no
// Docker port, so the gateways keep only Ready Runs in memory), all of it
// on this machine, and a bash Runtime of its own (two Pods of 16 slots) so
// that the examples' sizes do not decide the figures. Run one
// sub-benchmark per command (see the Makefile's bench target): each starts
// its own cluster.
func BenchmarkKube(b *testing.B) {
	e := startKubeWith(b, kubeInstall{})
	rt := &v1alpha1.Runtime{Spec: v1alpha1.RuntimeSpec{Server: "bash", Replicas: 2, Runs: 16}}
	rt.APIVersion, rt.Kind = v1alpha1.GroupVersion.String(), "Runtime"
	rt.Name, rt.Namespace = benchRuntime, runsNamespace
	if err := e.stoke.Post().Namespace(runsNamespace).Resource("runtimes").Body(rt).Do(context.Background()).Error(); err != nil {
		b.Fatal(err)
	}
	e.awaitRuntimesReady(b, installBound)

	// Throughput: *kubeTasks `true` tasks created by 32 concurrent clients,
	// from the first creation to the last one Succeeded; and the API
	// server's writes per Run meanwhile, from every client.
	// Its ceiling on this machine is BenchmarkKubeCeiling/Throughput,
	// which the same -bench pattern runs next.
	b.Run("Throughput", func(b *testing.B) {
		n := *kubeTasks
		var writes writeCounts
		var elapsed, cpu time.Duration
		var stokeCPU cpuTimes
		round := benchRound.Add(1)
		for op := range b.N {
			label := fmt.Sprintf("tp%d-%d", round, op)
			runs := e.watchRuns(b, "e2e="+label)
			before := e.apiWrites(b)
			profiled := func() {}
			if *kubePprof != "" {
				profiled = e.profileAll(b, filepath.Join(*kubePprof, label), *kubePprofSeconds)
			}
			cpuBefore, procsBefore := e.cluster.CPUTime(b), e.cpu(b)
			start := time.Now()
			e.createConcurrently(b, label, n)
			runs.until(b, loadBound+time.Duration(n)*50*time.Millisecond, "every task Succeeded", func(m map[string]*v1alpha1.Run) bool {
				return countPhase(m, v1alpha1.PhaseSucceeded) == n
			})
			elapsed += time.Since(start)
			cpu += e.cluster.CPUTime(b) - cpuBefore
			stokeCPU.add(e.cpu(b).minus(procsBefore))
			profiled()
			writes.add(e.apiWrites(b).minus(before))
			b.Logf("%s: %s; %s", label, phaseGaps(runs), waiting(runs))
			runs.close()
			e.deleteLabelled(b, label)
		}
		total := float64(n * b.N)
		b.ReportMetric(total/elapsed.Seconds(), "runs/s")
		b.ReportMetric(writes.total()/total, "writes/run")
		b.ReportMetric(writes.resource("runs")/total, "run-writes/run")
		b.ReportMetric(float64(cpu)/float64(time.Millisecond)/total, "cluster-cpu-ms/run")
		b.Logf("API server writes per task Run (%d Runs, all clients): %s", int(total), writes.per(total, stokeWrites))
		b.Logf("of which writes to Runs per Run: %.2f (runs and runs/status); cluster (etcd, API server, controller-manager, scheduler) CPU per Run: %.1f ms",
			writes.resource("runs")/total, float64(cpu)/float64(time.Millisecond)/total)
		b.ReportMetric(float64(stokeCPU.stoke())/float64(time.Millisecond)/total, "stoke-cpu-ms/run")
		b.Logf("CPU ms per Run by process (%d Runs, from the first creation to the last Succeeded): %s", int(total), stokeCPU.per(total))
	})

	// CreateToSucceeded: one `true` task at a time, from its creation to
	// the watch seeing it Succeeded; and the writes per Run.
	b.Run("CreateToSucceeded", func(b *testing.B) {
		label := fmt.Sprintf("seq%d", benchRound.Add(1))
		runs := e.watchRuns(b, "e2e="+label)
		lat := make([]time.Duration, 0, b.N)
		before := e.apiWrites(b)
		b.ResetTimer()
		for i := range b.N {
			name := fmt.Sprintf("%s-%d", label, i)
			start := time.Now()
			e.mustCreateRun(b, labelled(newRun(name, trueTask()), label))
			runs.until(b, runBound, name+" Succeeded", func(m map[string]*v1alpha1.Run) bool {
				return phaseOf(m, name) == v1alpha1.PhaseSucceeded
			})
			lat = append(lat, time.Since(start))
		}
		b.StopTimer()
		writes := e.apiWrites(b).minus(before)
		reportPercentiles(b, lat)
		b.ReportMetric(float64(writes.total())/float64(b.N), "writes/run")
		b.ReportMetric(float64(writes.resource("runs"))/float64(b.N), "run-writes/run")
		b.Logf("API server writes per task Run (%d sequential Runs, all clients): %s", b.N, writes.per(float64(b.N), stokeWrites))
		e.deleteLabelled(b, label)
	})

	// FunctionReady: one Bash function at a time on the warm Pods, from
	// its creation to the watch seeing it Ready; each is deleted before
	// the next, so the slots stay free.
	b.Run("FunctionReady", func(b *testing.B) {
		label := fmt.Sprintf("fn%d", benchRound.Add(1))
		runs := e.watchRuns(b, "e2e="+label)
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for i := range b.N {
			name := fmt.Sprintf("%s-%d", label, i)
			start := time.Now()
			spec := function(benchRuntime, "fn.handle", "fn.sh", `handle() { printf '{"got":%s}' "$1"; }`)
			e.mustCreateRun(b, labelled(newRun(name, spec), label))
			runs.until(b, runBound, name+" Ready", func(m map[string]*v1alpha1.Run) bool {
				return phaseOf(m, name) == v1alpha1.PhaseReady
			})
			lat = append(lat, time.Since(start))
			b.StopTimer()
			e.deleteRun(b, name)
			runs.until(b, runBound, name+" gone", func(m map[string]*v1alpha1.Run) bool { return m[name] == nil })
			b.StartTimer()
		}
		b.StopTimer()
		reportPercentiles(b, lat)
	})

	// WorkflowFanOut100: a WorkflowRun of 100 `true` job instances
	// (benchKubeWorkflowFanOut).
	b.Run("WorkflowFanOut100", func(b *testing.B) { benchKubeWorkflowFanOut(b, e) })

	// ScaleFromZero: a Python Function with scale.min 0, its first
	// invocation through a gateway (benchScaleFromZero).
	var users *gatewayUsers
	b.Run("ScaleFromZero", func(b *testing.B) {
		if users == nil {
			users = e.gatewayUsers(b)
		}
		benchScaleFromZero(b, e, users)
	})
}

// BenchmarkKubeCeiling/Throughput is the ceiling of
// BenchmarkKube/Throughput on this machine: as many task Runs, created at
// the same concurrency, each taken through the writes Stoke makes for it
// (its creation, then three status writes with the content Stoke writes:
// the scheduler's Scheduled, runtimed's Running and Succeeded) by the
// benchmark itself through the Kubernetes store, one Run after the other
// per client, on a cluster started as startKube starts it but without
// Stoke: no controller, runtimed, Pods, node agents or watchers. It reports
// lifecycles/s, the API server's writes per lifecycle (4, as a check), and
// the cluster's CPU per lifecycle, for comparison with Throughput's
// runs/s and cluster-cpu-ms/run. The sub-benchmark is named Throughput so
// that `-bench 'Kube(Ceiling)?$/Throughput'` runs it after BenchmarkKube/Throughput,
// once that cluster is gone.
func BenchmarkKubeCeiling(b *testing.B) {
	e := startCluster(b)
	s, err := kube.Open(e.cluster.Config, kube.Options{UserAgent: "stoke-bench-ceiling"})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	// Warm the API server up (its CRD handler, CEL programs, watch
	// cache), as installing Stoke and the Runtime does for Throughput.
	warm := fmt.Sprintf("warm%d", benchRound.Add(1))
	e.lifecycles(b, s, warm, 64)
	e.deleteLabelled(b, warm)

	b.Run("Throughput", func(b *testing.B) {
		n := *kubeTasks
		var writes writeCounts
		var elapsed, cpu time.Duration
		round := benchRound.Add(1)
		for op := range b.N {
			label := fmt.Sprintf("ceil%d-%d", round, op)
			before := e.apiWrites(b)
			cpuBefore := e.cluster.CPUTime(b)
			start := time.Now()
			e.lifecycles(b, s, label, n)
			elapsed += time.Since(start)
			cpu += e.cluster.CPUTime(b) - cpuBefore
			writes.add(e.apiWrites(b).minus(before))
			e.deleteLabelled(b, label)
		}
		total := float64(n * b.N)
		b.ReportMetric(total/elapsed.Seconds(), "lifecycles/s")
		b.ReportMetric(writes.total()/total, "writes/lifecycle")
		b.ReportMetric(float64(cpu)/float64(time.Millisecond)/total, "cluster-cpu-ms/lifecycle")
		b.Logf("API server writes per lifecycle (%d lifecycles, all clients): %s", int(total), writes.per(total, ceilingWrites))
	})
}

// lifecycles takes n `true` task Runs labelled label through the writes
// Stoke makes for each, benchConcurrency at a time, through s.
func (e *kubeEnv) lifecycles(b *testing.B, s *kube.Store, label string, n int) {
	b.Helper()
	ctx := context.Background()
	// A pod of the bench Runtime's shape, as the scheduler names it.
	podName, podUID := benchRuntime+"-5d8f7c9b6-x2k4q", "3f6b2a1e-8c4d-4e7a-9b0f-1a2b3c4d5e6f"
	lifecycle := func(name string) error {
		r, err := s.Runs().Create(ctx, labelled(newRun(name, trueTask()), label))
		if err != nil {
			return err
		}
		// The scheduler's assignment.
		now := metav1.Now()
		r.Status.Phase, r.Status.AssignedPod, r.Status.AssignedPodUID, r.Status.Attempt = v1alpha1.PhaseScheduled, podName, podUID, 1
		meta.SetStatusCondition(&r.Status.Conditions, metav1.Condition{
			Type: scheduler.ConditionScheduled, Status: metav1.ConditionTrue, Reason: scheduler.ReasonScheduled,
			Message: "attempt 1 assigned to pod " + podName, ObservedGeneration: r.Generation, LastTransitionTime: now,
		})
		if r, err = s.Runs().UpdateStatus(ctx, r); err != nil {
			return err
		}
		// runtimed's claim.
		now = metav1.Now()
		r.Status.Phase, r.Status.StartTime = v1alpha1.PhaseRunning, &now
		if r, err = s.Runs().UpdateStatus(ctx, r); err != nil {
			return err
		}
		// runtimed's end.
		now = metav1.Now()
		exit := int32(0)
		r.Status.Phase, r.Status.Reason, r.Status.CompletionTime, r.Status.ExitCode = v1alpha1.PhaseSucceeded, "Succeeded", &now, &exit
		_, err = s.Runs().UpdateStatus(ctx, r)
		return err
	}
	concurrently(b, label, n, func(name string) error {
		if err := lifecycle(name); err != nil {
			return fmt.Errorf("run %s: %w", name, err)
		}
		return nil
	})
}

// trueTask is a task that does nothing, on the bench Runtime.
func trueTask() v1alpha1.RunSpec {
	return task(benchRuntime, "t.sh", "true\n")
}

// createConcurrently creates n `true` tasks labelled label with
// benchConcurrency clients.
func (e *kubeEnv) createConcurrently(b *testing.B, label string, n int) {
	b.Helper()
	concurrently(b, label, n, func(name string) error {
		_, err := e.createRun(context.Background(), labelled(newRun(name, trueTask()), label))
		return err
	})
}

// concurrently calls do with the n names label-0000, label-0001, … from
// benchConcurrency goroutines, and fails b with the first error (a worker
// that fails stops; the others finish the names).
func concurrently(b *testing.B, label string, n int, do func(name string) error) {
	b.Helper()
	names := make(chan string)
	errs := make(chan error, benchConcurrency)
	var wg sync.WaitGroup
	for range benchConcurrency {
		wg.Go(func() {
			for name := range names {
				if err := do(name); err != nil {
					errs <- err
					for range names { // drain, so that the feeder ends
					}
					return
				}
			}
		})
	}
	for i := range n {
		names <- fmt.Sprintf("%s-%04d", label, i)
	}
	close(names)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}

// deleteLabelled deletes the Runs labelled e2e=label.
func (e *kubeEnv) deleteLabelled(b *testing.B, label string) {
	b.Helper()
	err := e.stoke.Delete().Namespace(runsNamespace).Resource("runs").
		VersionedParams(&metav1.ListOptions{LabelSelector: "e2e=" + label}, metav1.ParameterCodec).Do(context.Background()).Error()
	if err != nil {
		b.Fatal(err)
	}
}

func countPhase(m map[string]*v1alpha1.Run, p v1alpha1.Phase) int {
	n := 0
	for _, r := range m {
		if r.Status.Phase == p {
			n++
		}
	}
	return n
}

// reportPercentiles reports the p50 and p99 of lat in milliseconds.
func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	at := func(q float64) float64 {
		return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(at(0.50), "p50-ms")
	b.ReportMetric(at(0.99), "p99-ms")
}

// writeCounts are the API server's write requests by "resource[/subresource]
// VERB".
type writeCounts map[string]float64

// writeVerbs are the verbs of apiserver_request_total that write.
var writeVerbs = map[string]bool{"POST": true, "PUT": true, "PATCH": true, "DELETE": true, "APPLY": true}

// apiWrites scrapes the API server's /metrics as the admin and sums
// apiserver_request_total over the writing verbs.
func (e *kubeEnv) apiWrites(b testing.TB) writeCounts {
	b.Helper()
	return writesOf(b, e.apiMetrics(b))
}

// apiMetrics scrapes the API server's /metrics as the admin.
func (e *kubeEnv) apiMetrics(b testing.TB) map[string]*dto.MetricFamily {
	b.Helper()
	raw, err := e.kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		b.Fatalf("the API server's metrics: %v", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		b.Fatalf("the API server's metrics: %v", err)
	}
	return families
}

// writesOf sums apiserver_request_total of families over the writing
// verbs.
func writesOf(b testing.TB, families map[string]*dto.MetricFamily) writeCounts {
	b.Helper()
	out := writeCounts{}
	fam := families["apiserver_request_total"]
	if fam == nil {
		b.Fatal("the API server has no apiserver_request_total")
	}
	for _, m := range fam.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if !writeVerbs[labels["verb"]] {
			continue
		}
		key := labels["resource"]
		if s := labels["subresource"]; s != "" {
			key += "/" + s
		}
		out[key+" "+labels["verb"]] += m.GetCounter().GetValue()
	}
	return out
}

func (w writeCounts) minus(before writeCounts) writeCounts {
	out := writeCounts{}
	for k, v := range w {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

func (w *writeCounts) add(o writeCounts) {
	if *w == nil {
		*w = writeCounts{}
	}
	for k, v := range o {
		(*w)[k] += v
	}
}

func (w writeCounts) total() float64 {
	var t float64
	for _, v := range w {
		t += v
	}
	return t
}

// resource sums the writes to resource and its subresources.
func (w writeCounts) resource(resource string) float64 {
	var t float64
	for k, v := range w {
		if k == resource || strings.HasPrefix(k, resource+" ") || strings.HasPrefix(k, resource+"/") {
			t += v
		}
	}
	return t
}

// stokeWrites says who makes each kind of write while Stoke runs Runs, for
// the benchmarks' logs.
var stokeWrites = map[string]string{
	"runs POST":             "the benchmark's creations",
	"runs/status PUT":       "Run status: the scheduler's Scheduled, and Unschedulable when a pool is stuck; runtimed's Running and end; retries after a conflict",
	"runs DELETE":           "deletions",
	"leases PUT":            "Lease renewals: runtimed's, one per runtime Pod; the node agents'; the controller's leader election; the API server's own",
	"leases POST":           "Leases created",
	"runtimes/status PATCH": "the controller's Runtime status: ready Pods, free slots",
	"pods/status PATCH":     "the node agents' Pod status",
	"events POST":           "Events",
}

// ceilingWrites says who makes each kind of write in BenchmarkKubeCeiling.
var ceilingWrites = map[string]string{
	"runs POST":       "the benchmark's creations",
	"runs/status PUT": "the benchmark's three status writes per Run",
	"leases PUT":      "the API server's own Lease",
}

// per lists the writes per n Runs, most first, each with who makes it
// (sources).
func (w writeCounts) per(n float64, sources map[string]string) string {
	keys := make([]string, 0, len(w))
	for k := range w {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return w[keys[i]] > w[keys[j]] })
	var parts []string
	for _, k := range keys {
		part := fmt.Sprintf("%s %.2f", k, w[k]/n)
		if src := sources[k]; src != "" {
			part += " (" + src + ")"
		}
		parts = append(parts, part)
	}
	return fmt.Sprintf("%.2f in all: %s", w.total()/n, strings.Join(parts, ", "))
}

// phaseGaps says where the Runs' time went, as the watch saw it: the
// median and p99 from first seen to Scheduled, Scheduled to Running,
// Running to Succeeded, and Scheduled to Succeeded for the Runs never seen
// Running.
func phaseGaps(runs *objects[*v1alpha1.Run]) string {
	runs.mu.Lock()
	first := map[string]map[v1alpha1.Phase]time.Time{}
	for _, h := range runs.history {
		m := first[h.obj.Name]
		if m == nil {
			m = map[v1alpha1.Phase]time.Time{"": h.at}
			first[h.obj.Name] = m
		}
		if _, ok := m[h.obj.Status.Phase]; !ok {
			m[h.obj.Status.Phase] = h.at
		}
	}
	runs.mu.Unlock()
	// A task that ended before runtimed wrote it Running (its claim
	// deferred, docs/runtimed.md) goes from Scheduled to Succeeded: the
	// last pair counts those, and how many there were.
	pairs := [][2]v1alpha1.Phase{{"", v1alpha1.PhaseScheduled}, {v1alpha1.PhaseScheduled, v1alpha1.PhaseRunning},
		{v1alpha1.PhaseRunning, v1alpha1.PhaseSucceeded}, {v1alpha1.PhaseScheduled, v1alpha1.PhaseSucceeded}}
	var parts []string
	for i, pair := range pairs {
		var gaps []time.Duration
		for _, m := range first {
			from, ok1 := m[pair[0]]
			to, ok2 := m[pair[1]]
			_, ran := m[v1alpha1.PhaseRunning]
			if ok1 && ok2 && (i < len(pairs)-1 || !ran) {
				gaps = append(gaps, to.Sub(from))
			}
		}
		if len(gaps) == 0 {
			continue
		}
		sort.Slice(gaps, func(a, b int) bool { return gaps[a] < gaps[b] })
		name := string(pair[0])
		if name == "" {
			name = "seen"
		}
		parts = append(parts, fmt.Sprintf("%s→%s p50 %v p99 %v (%d)", name, pair[1],
			gaps[len(gaps)/2].Round(time.Millisecond), gaps[min(len(gaps)-1, len(gaps)*99/100)].Round(time.Millisecond), len(gaps)))
	}
	return strings.Join(parts, ", ")
}

// waiting says how many Runs the watch saw marked Unschedulable (one status
// write each) and the longest time between two assignments, as the watch
// saw them: the longest the pool went without handing out a slot.
func waiting(runs *objects[*v1alpha1.Run]) string {
	runs.mu.Lock()
	defer runs.mu.Unlock()
	marked := map[string]bool{}
	scheduled := map[string]bool{}
	var last time.Time
	var longest time.Duration
	for _, h := range runs.history {
		c := meta.FindStatusCondition(h.obj.Status.Conditions, scheduler.ConditionScheduled)
		if c != nil && c.Status == metav1.ConditionFalse && c.Reason == scheduler.ReasonUnschedulable {
			marked[h.obj.Name] = true
		}
		if h.obj.Status.Phase == v1alpha1.PhaseScheduled && !scheduled[h.obj.Name] {
			scheduled[h.obj.Name] = true
			if !last.IsZero() {
				longest = max(longest, h.at.Sub(last))
			}
			last = h.at
		}
	}
	return fmt.Sprintf("%d Runs marked Unschedulable; longest time between two assignments %v", len(marked), longest.Round(time.Millisecond))
}
