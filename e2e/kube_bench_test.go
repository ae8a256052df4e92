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

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
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
// installed from deploy/ (startKube), all of it on this machine, and a
// bash Runtime of its own (two Pods of 16 slots) so that the examples'
// sizes do not decide the figures. Run one sub-benchmark per command
// (see the Makefile's bench target): each starts its own cluster.
func BenchmarkKube(b *testing.B) {
	e := startKube(b)
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
	b.Run("Throughput", func(b *testing.B) {
		n := *kubeTasks
		var writes writeCounts
		var elapsed time.Duration
		round := benchRound.Add(1)
		for op := range b.N {
			label := fmt.Sprintf("tp%d-%d", round, op)
			runs := e.watchRuns(b, "e2e="+label)
			before := e.apiWrites(b)
			profiled := func() {}
			if *kubePprof != "" {
				profiled = e.profileAll(b, filepath.Join(*kubePprof, label), *kubePprofSeconds)
			}
			start := time.Now()
			e.createConcurrently(b, label, n)
			runs.until(b, loadBound+time.Duration(n)*50*time.Millisecond, "every task Succeeded", func(m map[string]*v1alpha1.Run) bool {
				return countPhase(m, v1alpha1.PhaseSucceeded) == n
			})
			elapsed += time.Since(start)
			profiled()
			writes.add(e.apiWrites(b).minus(before))
			b.Logf("%s: %s", label, phaseGaps(runs))
			runs.close()
			e.deleteLabelled(b, label)
		}
		total := float64(n * b.N)
		b.ReportMetric(total/elapsed.Seconds(), "runs/s")
		b.ReportMetric(float64(writes.total())/total, "writes/run")
		b.ReportMetric(float64(writes.resource("runs"))/total, "run-writes/run")
		b.Logf("API server writes per Run (%d Runs, all clients): %s", int(total), writes.per(total))
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
		b.Logf("API server writes per Run (%d sequential Runs, all clients): %s", b.N, writes.per(float64(b.N)))
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
}

// trueTask is a task that does nothing, on the bench Runtime.
func trueTask() v1alpha1.RunSpec {
	return task(benchRuntime, "t.sh", "true\n")
}

// createConcurrently creates n `true` tasks labelled label with
// benchConcurrency clients.
func (e *kubeEnv) createConcurrently(b *testing.B, label string, n int) {
	b.Helper()
	names := make(chan string)
	errs := make(chan error, benchConcurrency)
	var wg sync.WaitGroup
	for range benchConcurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range names {
				if _, err := e.createRun(context.Background(), labelled(newRun(name, trueTask()), label)); err != nil {
					errs <- err
					for range names { // drain, so that the feeder ends
					}
					return
				}
			}
		}()
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
	raw, err := e.kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		b.Fatalf("the API server's metrics: %v", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		b.Fatalf("the API server's metrics: %v", err)
	}
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

// per lists the writes per n Runs, most first.
func (w writeCounts) per(n float64) string {
	keys := make([]string, 0, len(w))
	for k := range w {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return w[keys[i]] > w[keys[j]] })
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.2f", k, w[k]/n))
	}
	return fmt.Sprintf("%.2f in all: %s", w.total()/n, strings.Join(parts, ", "))
}

// phaseGaps says where the Runs' time went, as the watch saw it: the
// median and p99 from first seen to Scheduled, Scheduled to Running, and
// Running to Succeeded.
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
	steps := []v1alpha1.Phase{"", v1alpha1.PhaseScheduled, v1alpha1.PhaseRunning, v1alpha1.PhaseSucceeded}
	var parts []string
	for i := 1; i < len(steps); i++ {
		var gaps []time.Duration
		for _, m := range first {
			from, ok1 := m[steps[i-1]]
			to, ok2 := m[steps[i]]
			if ok1 && ok2 {
				gaps = append(gaps, to.Sub(from))
			}
		}
		if len(gaps) == 0 {
			continue
		}
		sort.Slice(gaps, func(a, b int) bool { return gaps[a] < gaps[b] })
		name := string(steps[i-1])
		if name == "" {
			name = "seen"
		}
		parts = append(parts, fmt.Sprintf("%s→%s p50 %v p99 %v (%d)", name, steps[i],
			gaps[len(gaps)/2].Round(time.Millisecond), gaps[min(len(gaps)-1, len(gaps)*99/100)].Round(time.Millisecond), len(gaps)))
	}
	return strings.Join(parts, ", ")
}
