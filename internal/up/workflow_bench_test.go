package up_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/up"
	"stoke.dev/stoke/internal/workflow"
)

// wideBash is a bash Runtime with room for a fan-out of 100 jobs at once.
func wideBash(cfg *up.Config) {
	cfg.DefaultRuntimes = append(cfg.DefaultRuntimes, &v1alpha1.Runtime{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindRuntime},
		ObjectMeta: metav1.ObjectMeta{Name: "wide", Namespace: store.DefaultNamespace},
		Spec:       v1alpha1.RuntimeSpec{Server: "bash", Replicas: 2, Runs: 64},
	})
}

// runEvents watches the Runs and the WorkflowRuns of namespace default
// and records when this process first saw each Run in each phase (""
// for its creation) and each WorkflowRun end.
type runEvents struct {
	mu      sync.Mutex
	runs    map[string]map[v1alpha1.Phase]time.Time
	labels  map[string]map[string]string
	wfEnd   map[string]time.Time
	wfPhase map[string]v1alpha1.WorkflowPhase
	changed chan struct{}
}

func watchEvents(b *testing.B, ctx context.Context, s *server) *runEvents {
	ev := &runEvents{runs: map[string]map[v1alpha1.Phase]time.Time{}, labels: map[string]map[string]string{},
		wfEnd: map[string]time.Time{}, wfPhase: map[string]v1alpha1.WorkflowPhase{}, changed: make(chan struct{}, 1)}
	for _, kind := range []string{"runs", "workflowruns"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/v1/namespaces/default/"+kind+"?watch=true", nil)
		req.Header.Set("Authorization", "Bearer "+s.token)
		resp, err := s.client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("watch %s: %d", kind, resp.StatusCode)
		}
		go func() {
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(nil, 16<<20)
			for sc.Scan() {
				now := time.Now()
				if kind == "runs" {
					var e struct{ Object v1alpha1.Run }
					if json.Unmarshal(sc.Bytes(), &e) != nil {
						continue
					}
					ev.mu.Lock()
					m := ev.runs[e.Object.Name]
					if m == nil {
						m = map[v1alpha1.Phase]time.Time{"": now}
						ev.runs[e.Object.Name] = m
						ev.labels[e.Object.Name] = e.Object.Labels
					}
					if _, ok := m[e.Object.Status.Phase]; !ok {
						m[e.Object.Status.Phase] = now
					}
					ev.mu.Unlock()
				} else {
					var e struct{ Object v1alpha1.WorkflowRun }
					if json.Unmarshal(sc.Bytes(), &e) != nil {
						continue
					}
					ev.mu.Lock()
					if e.Object.Status.Phase.Terminal() {
						if _, ok := ev.wfEnd[e.Object.Name]; !ok {
							ev.wfEnd[e.Object.Name] = now
							ev.wfPhase[e.Object.Name] = e.Object.Status.Phase
						}
					}
					ev.mu.Unlock()
				}
				select {
				case ev.changed <- struct{}{}:
				default:
				}
			}
		}()
	}
	return ev
}

// awaitWorkflow waits until the WorkflowRun name ended and returns when.
func (ev *runEvents) awaitWorkflow(b *testing.B, name string) time.Time {
	deadline := time.After(2 * time.Minute)
	for {
		ev.mu.Lock()
		t, ok := ev.wfEnd[name]
		ph := ev.wfPhase[name]
		ev.mu.Unlock()
		if ok {
			if ph != v1alpha1.WorkflowSucceeded {
				b.Fatalf("workflowrun %s: %s", name, ph)
			}
			return t
		}
		select {
		case <-ev.changed:
		case <-deadline:
			b.Fatalf("workflowrun %s did not end within 2 minutes", name)
		}
	}
}

// awaitRun waits until the Run name was seen in phase.
func (ev *runEvents) awaitRun(b *testing.B, name string, phase v1alpha1.Phase) time.Time {
	deadline := time.After(2 * time.Minute)
	for {
		ev.mu.Lock()
		t, ok := ev.runs[name][phase]
		ev.mu.Unlock()
		if ok {
			return t
		}
		select {
		case <-ev.changed:
		case <-deadline:
			b.Fatalf("run %s not %s within 2 minutes", name, phase)
		}
	}
}

func (s *server) createWorkflowRun(b *testing.B, manifest string) time.Time {
	b.Helper()
	start := time.Now()
	r := s.do(b, http.MethodPost, "/v1/namespaces/default/workflowruns", manifest, map[string]string{"Content-Type": "application/yaml"})
	if r.status != http.StatusCreated {
		b.Fatalf("create workflowrun: %s", r)
	}
	return start
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func p50(lat []time.Duration) time.Duration {
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// BenchmarkUpWorkflowSteps20 is issue 22's per-step figure: a job of 20
// `true` steps (20 step Runs on one pod, in one workspace, each started
// after the previous ended) from create to Succeeded, beside its floor in
// the same run: one task Run whose bash script runs the same 20 commands,
// from create to Succeeded. The overhead per step is (job − script) / 20.
func BenchmarkUpWorkflowSteps20(b *testing.B) {
	s := startUp(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ev := watchEvents(b, ctx, s)
	var steps strings.Builder
	for range 20 {
		steps.WriteString("      - run: \"true\"\n")
	}
	script := strings.Repeat("true\n", 20)
	var job, floor, per []time.Duration
	for i := range b.N + 1 {
		name := fmt.Sprintf("script-%d", i)
		start := time.Now()
		s.create(b, fmt.Sprintf(`apiVersion: stoke.dev/v1alpha1
kind: Run
metadata: {name: %s}
spec:
  runtime: bash
  mode: {task: {entrypoint: s.sh}}
  source: {inline: {path: s.sh, text: %q}}
`, name, script))
		f := ev.awaitRun(b, name, v1alpha1.PhaseSucceeded).Sub(start)

		wf := fmt.Sprintf("steps-%d", i)
		start = s.createWorkflowRun(b, fmt.Sprintf(`apiVersion: stoke.dev/v1alpha1
kind: WorkflowRun
metadata: {name: %s}
spec:
  jobs:
    - id: j
      runsOn: bash
      steps:
%s`, wf, steps.String()))
		j := ev.awaitWorkflow(b, wf).Sub(start)
		if i == 0 {
			continue // warm-up: the first of each starts the pods' caches
		}
		job, floor = append(job, j), append(floor, f)
		per = append(per, (j-f)/20)
	}
	b.ReportMetric(ms(p50(per)), "per-step-overhead-p50-ms")
	b.ReportMetric(ms(p50(job)), "job20-p50-ms")
	b.ReportMetric(ms(p50(floor)), "script20-floor-p50-ms")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkUpWorkflowFanOut100 is issue 22's DAG figure: 100 `true` jobs
// (job instances: one, start, fanning out to a matrix of 98, which one,
// end, needs all of), from create to Succeeded; and the edge latency, from
// the end of a job's last need (its step Run seen Succeeded) to its own
// start (its first step Run seen created), over the 99 with needs. The floor beside it is one
// task Run of `true`, create to Succeeded, in the same run.
func BenchmarkUpWorkflowFanOut100(b *testing.B) {
	s := startUp(b, wideBash)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ev := watchEvents(b, ctx, s)
	// A WorkflowRun has at most 64 jobs (bounds.WorkflowJobs): the 98
	// in the middle are one job's matrix instances.
	vals := make([]string, 98)
	for k := range vals {
		vals[k] = fmt.Sprint(k)
	}
	var m strings.Builder
	m.WriteString("    - {id: start, runsOn: wide, steps: [{run: \"true\"}]}\n")
	fmt.Fprintf(&m, "    - {id: mid, needs: [start], runsOn: wide, strategy: {matrix: {axes: [{name: k, values: [%s]}]}}, steps: [{run: \"true\"}]}\n", strings.Join(vals, ", "))
	m.WriteString("    - {id: end, needs: [mid], runsOn: wide, steps: [{run: \"true\"}]}\n")
	var total, edges, floor []time.Duration
	for i := range b.N + 1 {
		name := fmt.Sprintf("true-%d", i)
		start := time.Now()
		s.create(b, fmt.Sprintf(`{"metadata":{"name":%q},"spec":{"runtime":"wide","mode":{"task":{"args":["true"]}}}}`, name))
		f := ev.awaitRun(b, name, v1alpha1.PhaseSucceeded).Sub(start)

		wf := fmt.Sprintf("fan-%d", i)
		start = s.createWorkflowRun(b, fmt.Sprintf("apiVersion: stoke.dev/v1alpha1\nkind: WorkflowRun\nmetadata: {name: %s}\nspec:\n  jobs:\n%s", wf, m.String()))
		t := ev.awaitWorkflow(b, wf).Sub(start)
		if i == 0 {
			continue
		}
		total, floor = append(total, t), append(floor, f)
		edges = append(edges, ev.edges(wf)...)
	}
	b.ReportMetric(ms(p50(total)), "create-to-succeeded-p50-ms")
	b.ReportMetric(ms(p50(edges)), "edge-p50-ms")
	b.ReportMetric(ms(p50(floor)), "one-task-floor-p50-ms")
	b.ReportMetric(0, "ns/op")
}

// edges are the edge latencies of the fan-out WorkflowRun wf: each mid
// job's start after start's end, and end's start after the last mid's.
func (ev *runEvents) edges(wf string) []time.Duration {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	var out []time.Duration
	var startDone, lastMid, endBegin time.Time
	var mids []time.Time
	for name, l := range ev.labels {
		if l[workflow.LabelWorkflowRun] != wf {
			continue
		}
		switch l[workflow.LabelJob] {
		case "start":
			startDone = ev.runs[name][v1alpha1.PhaseSucceeded]
		case "end":
			endBegin = ev.runs[name][""]
		default:
			mids = append(mids, ev.runs[name][""])
			if d := ev.runs[name][v1alpha1.PhaseSucceeded]; d.After(lastMid) {
				lastMid = d
			}
		}
	}
	for _, t := range mids {
		out = append(out, t.Sub(startDone))
	}
	return append(out, endBegin.Sub(lastMid))
}
