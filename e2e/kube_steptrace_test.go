package e2e

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/runtimeset"
)

// stepTrace is the way of step Runs on their Pods, stage by stage, from
// runtimed's "task ended" log lines (runtimed's clock: the same machine's)
// and this test's watch: the Scheduled write seen here → runtimed took the
// Run (its own Run watch) → the Runtime Server had its execution (source
// written, process started) → runtimed knew it exited → its end write
// began → the write returned → this test's watch saw the end.
type stepTrace struct {
	stages [6][]time.Duration
	runs   int
}

var stepTraceStages = [6]string{"scheduled-seen-to-took", "took-to-executing", "executing-to-exited", "exited-to-writing", "end-write", "written-to-seen"}

// taskEndedLine is runtimed's "task ended" line (runtimed.worker.logEnded).
type taskEndedLine struct {
	Time      time.Time `json:"time"`
	Msg       string    `json:"msg"`
	Run       string    `json:"run"`
	Took      time.Time `json:"took"`
	Executing time.Time `json:"executing"`
	Exited    time.Time `json:"exited"`
	Writing   time.Time `json:"writing"`
}

// add traces the step Runs runs saw, each from its Pod's runtimed log.
func (s *stepTrace) add(b testing.TB, e *kubeEnv, runs *objects[*v1alpha1.Run]) {
	b.Helper()
	lines := map[string]map[string]taskEndedLine{} // by Pod, by namespace/name
	for name, r := range runs.snapshot() {
		pod := r.Status.AssignedPod
		if _, ok := lines[pod]; !ok && pod != "" {
			lines[pod] = e.taskEndedLines(r.Namespace, pod)
		}
		l, ok := lines[pod][r.Namespace+"/"+name]
		if !ok || l.Executing.IsZero() {
			continue
		}
		scheduled, ok1 := runs.firstSeen(func(x *v1alpha1.Run) bool { return x.Name == name && x.Status.AssignedPodUID != "" })
		ended, ok2 := runs.firstSeen(func(x *v1alpha1.Run) bool { return x.Name == name && x.Status.Phase.Terminal() })
		if !ok1 || !ok2 {
			continue
		}
		s.runs++
		for k, d := range []time.Duration{l.Took.Sub(scheduled), l.Executing.Sub(l.Took), l.Exited.Sub(l.Executing),
			l.Writing.Sub(l.Exited), l.Time.Sub(l.Writing), ended.Sub(l.Time)} {
			s.stages[k] = append(s.stages[k], d)
		}
	}
}

// report reports each stage's percentiles as step-STAGE, and logs them.
func (s *stepTrace) report(b *testing.B) {
	var parts []string
	for k, name := range stepTraceStages {
		if len(s.stages[k]) == 0 {
			continue
		}
		reportPercentilesAs(b, s.stages[k], "step-"+name)
		d := slices.Sorted(slices.Values(s.stages[k]))
		var qs []string
		for _, q := range []float64{0, 0.1, 0.5, 0.9, 1} {
			qs = append(qs, fmt.Sprintf("%.1f", float64(d[min(len(d)-1, int(q*float64(len(d))))])/float64(time.Millisecond)))
		}
		parts = append(parts, name+" "+strings.Join(qs, "/"))
	}
	b.Logf("step Runs' way on their Pods (%d traced; min/p10/p50/p90/max ms): %s", s.runs, strings.Join(parts, "; "))
}

// taskEndedLines are the "task ended" lines of the runtimed of pod, by
// the Run's namespace/name.
func (e *kubeEnv) taskEndedLines(namespace, pod string) map[string]taskEndedLine {
	out := map[string]taskEndedLine{}
	e.runtimedLines(namespace, pod, "task ended", func(line []byte) bool {
		var l taskEndedLine
		if json.Unmarshal(line, &l) == nil && l.Msg == "task ended" && !l.Took.IsZero() {
			out[l.Run] = l
		}
		return true
	})
	return out
}

// runtimedLines calls each with every line of the runtimed log of pod
// (its container log, from whichever test node agent runs it) that holds
// msg as a JSON string, until each returns false.
func (e *kubeEnv) runtimedLines(namespace, pod, msg string, each func(line []byte) bool) {
	quoted := strconv.Quote(msg)
	for _, a := range e.agents {
		path, err := a.LogPath(namespace, pod, runtimeset.ContainerRuntimed)
		if err != nil {
			continue
		}
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(data), "\n") {
			if strings.Contains(line, quoted) && !each([]byte(line)) {
				return
			}
		}
	}
}

// apiTimes are the API server's own request times, as sums and counts of
// its histograms: "REQUEST" for apiserver_request_duration_seconds by verb
// and resource (the whole request in the API server), "apf-wait LEVEL" for
// apiserver_flowcontrol_request_wait_duration_seconds by priority level
// (the time queued by API Priority and Fairness before it ran), and "etcd
// OPERATION" for etcd_request_duration_seconds of Runs.
type apiTimes map[string][2]float64

// timesOf reads apiTimes from the API server's metrics (apiMetrics).
func timesOf(families map[string]*dto.MetricFamily) apiTimes {
	out := apiTimes{}
	add := func(key string, h *dto.Histogram) {
		v := out[key]
		out[key] = [2]float64{v[0] + h.GetSampleSum(), v[1] + float64(h.GetSampleCount())}
	}
	labels := func(m *dto.Metric) map[string]string {
		l := map[string]string{}
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		return l
	}
	for _, m := range families["apiserver_request_duration_seconds"].GetMetric() {
		l := labels(m)
		if r := l["resource"]; r == "runs" || r == "workflowruns" {
			if s := l["subresource"]; s != "" {
				r += "/" + s
			}
			add(l["verb"]+" "+r, m.GetHistogram())
		}
	}
	for _, m := range families["apiserver_flowcontrol_request_wait_duration_seconds"].GetMetric() {
		if l := labels(m); l["execute"] == "true" {
			add("apf-wait "+l["priority_level"], m.GetHistogram())
		}
	}
	for _, m := range families["etcd_request_duration_seconds"].GetMetric() {
		if l := labels(m); strings.Contains(l["type"], "runs") {
			add("etcd "+l["operation"]+" "+l["type"], m.GetHistogram())
		}
	}
	return out
}

// flowLimits are the API server's gauges of API Priority and Fairness
// for the priority levels that queued requests (apf-wait), to say why.
func flowLimits(families map[string]*dto.MetricFamily, levels apiTimes) string {
	var parts []string
	for _, name := range []string{"apiserver_flowcontrol_nominal_limit_seats", "apiserver_flowcontrol_current_limit_seats",
		"apiserver_flowcontrol_request_concurrency_limit", "apiserver_flowcontrol_current_executing_seats"} {
		for _, m := range families[name].GetMetric() {
			for _, p := range m.GetLabel() {
				if p.GetName() == "priority_level" {
					if _, ok := levels["apf-wait "+p.GetValue()]; ok {
						parts = append(parts, fmt.Sprintf("%s{%s} %g", strings.TrimPrefix(name, "apiserver_flowcontrol_"), p.GetValue(), m.GetGauge().GetValue()))
					}
				}
			}
		}
	}
	return strings.Join(parts, ", ")
}

// minus is the requests between before and t.
func (t apiTimes) minus(before apiTimes) apiTimes {
	out := apiTimes{}
	for k, v := range t {
		if n := v[1] - before[k][1]; n > 0 {
			out[k] = [2]float64{v[0] - before[k][0], n}
		}
	}
	return out
}

func (t *apiTimes) add(o apiTimes) {
	if *t == nil {
		*t = apiTimes{}
	}
	for k, v := range o {
		w := (*t)[k]
		(*t)[k] = [2]float64{w[0] + v[0], w[1] + v[1]}
	}
}

// String is each kind's mean time and count, most requests first.
func (t apiTimes) String() string {
	keys := slices.SortedFunc(maps.Keys(t), func(a, b string) int { return cmp.Compare(t[b][1], t[a][1]) })
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.1f ms (%d)", k, t[k][0]/t[k][1]*1000, int(t[k][1])))
	}
	return strings.Join(parts, ", ")
}
