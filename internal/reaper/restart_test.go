package reaper_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testingclock "k8s.io/utils/clock/testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/reaper"
	"stoke.dev/stoke/internal/retry"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/sqlite"
)

// RecoverRestart, before anything runs, on the Runs a previous process
// left on its pods: functions and Scheduled tasks are Pending again with
// their attempt, start time and endpoint; a Running task spends an
// attempt (or fails) as with any pod loss; a cancelled Run ends; a Run
// being deleted loses runtimed's finalizer; nothing else changes.
func TestRecoverRestart(t *testing.T) {
	ctx := context.Background()
	fc := testingclock.NewFakeClock(t0)
	st, err := sqlite.Open(ctx, t.TempDir(), sqlite.WithClock(fc.Now))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	e := &env{t: t, ctx: ctx, runs: st.Runs(), clk: fc}
	old := pod("bash-old")
	started := metav1.NewTime(t0.Add(-10 * time.Second))
	fn := func(r *v1alpha1.Run) {
		r.Spec.Mode = v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "h.f"}}
	}
	retried := func(r *v1alpha1.Run) { r.Spec.RetryPolicy = &v1alpha1.RetryPolicy{MaxAttempts: 3} }
	ready := func(name string, mutate ...func(*v1alpha1.Run)) {
		e.assigned(name, v1alpha1.PhaseReady, old, append([]func(*v1alpha1.Run){fn}, mutate...)...)
		e.setStatus(name, func(s *v1alpha1.RunStatus) {
			s.Attempt, s.StartTime, s.Endpoint = 2, &started, "http://x/"+name
			meta.SetStatusCondition(&s.Conditions, metav1.Condition{Type: "Scheduled", Status: metav1.ConditionTrue, Reason: "Scheduled"})
			meta.SetStatusCondition(&s.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Registered"})
		})
	}
	ready("fn-ready")
	e.assigned("fn-registering", v1alpha1.PhaseRunning, old, fn)
	e.assigned("task-scheduled", v1alpha1.PhaseScheduled, old)
	e.assigned("task-running", v1alpha1.PhaseRunning, old)
	e.assigned("task-running-retried", v1alpha1.PhaseRunning, old, retried)
	ready("fn-cancelled", func(r *v1alpha1.Run) { r.Spec.CancelRequested = true })
	ready("fn-deleted", func(r *v1alpha1.Run) { r.Finalizers = []string{reaper.RuntimedFinalizer} })
	if err := e.runs.Delete(ctx, "", "fn-deleted", store.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.create("pending")
	e.assigned("done", v1alpha1.PhaseSucceeded, old)
	before := map[string]*v1alpha1.Run{}
	list, _, err := e.runs.List(ctx, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range list {
		before[r.Name] = r
	}

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	r, err := reaper.New(reaper.Config{Runs: st.Runs(), RunInformer: informer.New(st.Runs(), informer.Options{Logger: log}),
		Pods: &fakePods{}, Clock: fc, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := r.RecoverRestart(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := (reaper.RestartSummary{Requeued: 3, Recovered: 3, Released: 1}); sum != want {
		t.Errorf("summary %+v, want %+v", sum, want)
	}
	get := func(name string) *v1alpha1.Run {
		t.Helper()
		r, err := e.runs.Get(ctx, "", name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return r
	}
	for _, name := range []string{"fn-ready", "fn-registering", "task-scheduled"} {
		s := get(name).Status
		b := before[name].Status
		if s.Phase != v1alpha1.PhasePending || s.Reason != string(retry.Restarted) || s.AssignedPodUID != "" || s.AssignedPod != "" {
			t.Errorf("%s: %s/%s on %q, want Pending/Restarted unassigned", name, s.Phase, s.Reason, s.AssignedPodUID)
		}
		if s.Attempt != b.Attempt || !s.StartTime.Equal(b.StartTime) || s.Endpoint != b.Endpoint {
			t.Errorf("%s: attempt %d start %v endpoint %q, want them kept: %d %v %q", name, s.Attempt, s.StartTime, s.Endpoint, b.Attempt, b.StartTime, b.Endpoint)
		}
		for _, ct := range []string{"Scheduled", "Ready"} {
			if c := meta.FindStatusCondition(s.Conditions, ct); c != nil && (c.Status != metav1.ConditionFalse || c.Reason != string(retry.Restarted)) {
				t.Errorf("%s: condition %s is %s/%s, want False/Restarted", name, ct, c.Status, c.Reason)
			}
		}
		if c := meta.FindStatusCondition(s.Conditions, retry.ConditionRetrying); c != nil {
			t.Errorf("%s: a Retrying condition %+v: the scheduler would wait for a backoff", name, c)
		}
	}
	if s := get("fn-ready").Status; s.Attempt != 2 || meta.FindStatusCondition(s.Conditions, "Ready") == nil {
		t.Errorf("fn-ready: attempt %d, conditions %+v", s.Attempt, s.Conditions)
	}
	if s := get("task-running").Status; s.Phase != v1alpha1.PhaseFailed || s.Reason != string(retry.PodGone) {
		t.Errorf("task-running: %s/%s, want Failed/PodGone", s.Phase, s.Reason)
	}
	if s := get("task-running-retried").Status; s.Phase != v1alpha1.PhasePending || s.Reason != string(retry.PodGone) || s.Attempt != 2 {
		t.Errorf("task-running-retried: %s/%s attempt %d, want Pending/PodGone attempt 2", s.Phase, s.Reason, s.Attempt)
	}
	if s := get("fn-cancelled").Status; s.Phase != v1alpha1.PhaseCancelled {
		t.Errorf("fn-cancelled: %s/%s, want Cancelled", s.Phase, s.Reason)
	}
	if _, err := e.runs.Get(ctx, "", "fn-deleted"); err == nil {
		t.Errorf("fn-deleted is still stored")
	}
	for _, name := range []string{"pending", "done"} {
		if got := get(name); got.ResourceVersion != before[name].ResourceVersion {
			t.Errorf("%s was written: rv %s → %s", name, before[name].ResourceVersion, got.ResourceVersion)
		}
	}
}
