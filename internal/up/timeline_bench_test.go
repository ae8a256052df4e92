package up_test

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// timeline is when a watch first saw each Run in each phase, and on which
// pod: where the Runs' time went, as a client sees it.
type timeline struct {
	runs map[string]*runTimes
}

type runTimes struct {
	pod string
	at  map[v1alpha1.Phase]time.Time // "" is the first event (the create)
}

// saw records run's phase at t, unless the Run was seen in it already.
func (tl *timeline) saw(run *v1alpha1.Run, t time.Time) {
	if tl.runs == nil {
		tl.runs = map[string]*runTimes{}
	}
	rt := tl.runs[run.Name]
	if rt == nil {
		rt = &runTimes{at: map[v1alpha1.Phase]time.Time{"": t}}
		tl.runs[run.Name] = rt
	}
	if p := run.Status.AssignedPodUID; p != "" {
		rt.pod = p
	}
	if _, ok := rt.at[run.Status.Phase]; !ok {
		rt.at[run.Status.Phase] = t
	}
}

// stages says, as p50 and p99 over the Runs, how long each step of a
// task Run took: seen (created) → Scheduled, Scheduled → Running (runtimed
// hears of the assignment and writes its claim), Running → Succeeded (the
// execution on the pod and the write of its end); and the slot hand-off,
// a Run's Succeeded to the next Scheduled on the same pod (the scheduler
// hears of the freed slot and writes the next assignment), pairing each
// pod's endings and later assignments in order. A slot's cycle is the sum
// of the last three.
func (tl *timeline) stages() string {
	type event struct {
		at        time.Time
		scheduled bool
	}
	gaps := map[string][]time.Duration{}
	byPod := map[string][]event{}
	add := func(name string, rt *runTimes, from, to v1alpha1.Phase) {
		a, ok1 := rt.at[from]
		z, ok2 := rt.at[to]
		if ok1 && ok2 {
			gaps[name] = append(gaps[name], z.Sub(a))
		}
	}
	for _, rt := range tl.runs {
		add("seen→Scheduled", rt, "", v1alpha1.PhaseScheduled)
		add("Scheduled→Running", rt, v1alpha1.PhaseScheduled, v1alpha1.PhaseRunning)
		add("Running→Succeeded", rt, v1alpha1.PhaseRunning, v1alpha1.PhaseSucceeded)
		if at, ok := rt.at[v1alpha1.PhaseScheduled]; ok && rt.pod != "" {
			byPod[rt.pod] = append(byPod[rt.pod], event{at, true})
		}
		if at, ok := rt.at[v1alpha1.PhaseSucceeded]; ok && rt.pod != "" {
			byPod[rt.pod] = append(byPod[rt.pod], event{at, false})
		}
	}
	for _, evs := range byPod {
		slices.SortFunc(evs, func(a, b event) int { return a.at.Compare(b.at) })
		var freed []time.Time
		for _, ev := range evs {
			switch {
			case !ev.scheduled:
				freed = append(freed, ev.at)
			case len(freed) > 0:
				gaps["Succeeded→next Scheduled"] = append(gaps["Succeeded→next Scheduled"], ev.at.Sub(freed[0]))
				freed = freed[1:]
			}
		}
	}
	var parts []string
	for _, name := range []string{"seen→Scheduled", "Scheduled→Running", "Running→Succeeded", "Succeeded→next Scheduled"} {
		g := gaps[name]
		if len(g) == 0 {
			continue
		}
		slices.Sort(g)
		parts = append(parts, fmt.Sprintf("%s p50 %v p99 %v (%d)", name,
			g[len(g)/2].Round(10*time.Microsecond), g[min(len(g)-1, len(g)*99/100)].Round(10*time.Microsecond), len(g)))
	}
	return strings.Join(parts, ", ")
}
