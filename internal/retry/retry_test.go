package retry

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
)

var t0 = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

func dur(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }

func policy(max int32, backoff *metav1.Duration, reasons ...string) *v1alpha1.RetryPolicy {
	return &v1alpha1.RetryPolicy{MaxAttempts: max, Backoff: backoff, RetryableReasons: reasons}
}

func running(p *v1alpha1.RetryPolicy, attempt int32) *v1alpha1.Run {
	start := metav1.NewTime(t0.Add(-time.Minute))
	return &v1alpha1.Run{
		ObjectMeta: metav1.ObjectMeta{Name: "r", Namespace: "default", UID: "u"},
		Spec: v1alpha1.RunSpec{
			Runtime: "bash", RetryPolicy: p,
			Mode: v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "h.f"}},
		},
		Status: v1alpha1.RunStatus{
			Phase: v1alpha1.PhaseReady, Attempt: attempt,
			AssignedPod: "bash-0", AssignedPodUID: "p-0", StartTime: &start,
			Endpoint: "http://127.0.0.1:8080/r", ExitCode: new(int32),
			Outputs: map[string]string{"K": "V"},
			Conditions: []metav1.Condition{
				{Type: "Scheduled", Status: metav1.ConditionTrue, Reason: "Assigned", LastTransitionTime: start},
				{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Registered", LastTransitionTime: start},
			},
		},
	}
}

func TestBackoff(t *testing.T) {
	tests := []struct {
		name   string
		policy *v1alpha1.RetryPolicy
		failed int32
		want   time.Duration
	}{
		{"no policy", nil, 1, DefaultBackoff},
		{"unset backoff", policy(5, nil), 1, time.Second},
		{"unset backoff doubles", policy(5, nil), 3, 4 * time.Second},
		{"first", policy(5, dur(3*time.Second)), 1, 3 * time.Second},
		{"second", policy(5, dur(3*time.Second)), 2, 6 * time.Second},
		{"third", policy(5, dur(3*time.Second)), 3, 12 * time.Second},
		{"fifth", policy(5, dur(3*time.Second)), 5, 48 * time.Second},
		{"capped", policy(5, dur(3*time.Second)), 6, MaxBackoff},
		{"just under cap", policy(5, dur(30*time.Second)), 2, 60 * time.Second},
		{"just over cap", policy(5, dur(30*time.Second+1)), 2, MaxBackoff},
		{"base at cap", policy(5, dur(MaxBackoff)), 1, MaxBackoff},
		{"base over cap", policy(5, dur(time.Hour)), 1, MaxBackoff},
		{"huge base", policy(5, dur(math.MaxInt64)), 7, MaxBackoff},
		{"1ns many doublings", policy(5, dur(1)), 30, 1 << 29},
		{"1ns 62 doublings", policy(5, dur(1)), 63, MaxBackoff},
		{"1ns 63 doublings", policy(5, dur(1)), 64, MaxBackoff},
		{"1ns 64 doublings", policy(5, dur(1)), 65, MaxBackoff},
		{"max attempt", policy(5, dur(time.Second)), math.MaxInt32, MaxBackoff},
		{"zero attempt", policy(5, dur(time.Second)), 0, time.Second},
		{"negative attempt", policy(5, dur(time.Second)), -5, time.Second},
		{"zero backoff", policy(5, dur(0)), 4, 0},
		{"negative backoff", policy(5, dur(-time.Second)), 4, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Backoff(tt.policy, tt.failed); got != tt.want {
				t.Errorf("Backoff = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestBackoffNeverOverflows(t *testing.T) {
	for _, base := range []time.Duration{1, 7, time.Millisecond, time.Second, 59 * time.Second, math.MaxInt64} {
		prev := time.Duration(0)
		for a := int32(1); a < 200; a++ {
			d := Backoff(policy(100, dur(base)), a)
			if d <= 0 || d > MaxBackoff || d < prev {
				t.Fatalf("base %v attempt %d: %v (previous %v)", base, a, d, prev)
			}
			prev = d
		}
	}
}

func TestDecide(t *testing.T) {
	tests := []struct {
		name      string
		run       func() *v1alpha1.Run
		reason    Reason
		retry     bool
		next      int32
		notBefore time.Time
		phase     v1alpha1.Phase
		wantRsn   Reason
	}{
		// maxAttempts
		{"no policy: one attempt", func() *v1alpha1.Run { return running(nil, 1) }, PodGone, false, 0, time.Time{}, v1alpha1.PhaseFailed, PodGone},
		{"maxAttempts 0 means 1", func() *v1alpha1.Run { return running(policy(0, nil), 1) }, PodGone, false, 0, time.Time{}, v1alpha1.PhaseFailed, PodGone},
		{"maxAttempts 1", func() *v1alpha1.Run { return running(policy(1, nil), 1) }, PodGone, false, 0, time.Time{}, v1alpha1.PhaseFailed, PodGone},
		{"maxAttempts 2, attempt 1", func() *v1alpha1.Run { return running(policy(2, nil), 1) }, PodGone, true, 2, t0.Add(time.Second), "", PodGone},
		{"maxAttempts 2, attempt 2", func() *v1alpha1.Run { return running(policy(2, nil), 2) }, PodGone, false, 0, time.Time{}, v1alpha1.PhaseFailed, PodGone},
		{"attempt past max", func() *v1alpha1.Run { return running(policy(2, nil), 7) }, PodGone, false, 0, time.Time{}, v1alpha1.PhaseFailed, PodGone},
		{"attempt 0 counts as 1", func() *v1alpha1.Run { return running(policy(2, nil), 0) }, PodGone, true, 2, t0.Add(time.Second), "", PodGone},
		{"maxAttempts 100, attempt 99", func() *v1alpha1.Run { return running(policy(100, nil), 99) }, PodGone, true, 100, t0.Add(MaxBackoff), "", PodGone},
		{"maxAttempts 100, attempt 100", func() *v1alpha1.Run { return running(policy(100, nil), 100) }, PodGone, false, 0, time.Time{}, v1alpha1.PhaseFailed, PodGone},

		// backoff in the decision
		{"backoff doubles", func() *v1alpha1.Run { return running(policy(5, dur(2*time.Second)), 3) }, ExecutionLost, true, 4, t0.Add(8 * time.Second), "", ExecutionLost},
		{"backoff capped", func() *v1alpha1.Run { return running(policy(10, dur(10*time.Second)), 4) }, ExecutionLost, true, 5, t0.Add(MaxBackoff), "", ExecutionLost},
		{"zero backoff", func() *v1alpha1.Run { return running(policy(3, dur(0)), 1) }, RegistrationFailed, true, 2, t0, "", RegistrationFailed},

		// default retryable set
		{"default RuntimeExecute", func() *v1alpha1.Run { return running(policy(3, nil), 1) }, RuntimeExecute, true, 2, t0.Add(time.Second), "", RuntimeExecute},
		{"default RegistrationFailed", func() *v1alpha1.Run { return running(policy(3, nil), 1) }, RegistrationFailed, true, 2, t0.Add(time.Second), "", RegistrationFailed},
		{"default ExecutionLost", func() *v1alpha1.Run { return running(policy(3, nil), 1) }, ExecutionLost, true, 2, t0.Add(time.Second), "", ExecutionLost},
		{"default PodGone", func() *v1alpha1.Run { return running(policy(3, nil), 1) }, PodGone, true, 2, t0.Add(time.Second), "", PodGone},
		{"default not NonZeroExit", func() *v1alpha1.Run { return running(policy(3, nil), 1) }, NonZeroExit, false, 0, time.Time{}, v1alpha1.PhaseFailed, NonZeroExit},
		{"default not Unschedulable", func() *v1alpha1.Run { return running(policy(3, nil), 1) }, Unschedulable, false, 0, time.Time{}, v1alpha1.PhaseFailed, Unschedulable},
		{"default not Timeout", func() *v1alpha1.Run { return running(policy(3, nil), 1) }, Timeout, false, 0, time.Time{}, v1alpha1.PhaseTimeout, Timeout},
		{"unknown reason string", func() *v1alpha1.Run { return running(policy(3, nil), 1) }, "SomethingElse", false, 0, time.Time{}, v1alpha1.PhaseFailed, "SomethingElse"},
		{"empty reason", func() *v1alpha1.Run { return running(policy(3, nil), 1) }, "", false, 0, time.Time{}, v1alpha1.PhaseFailed, Unknown},

		// never retried
		{"IncompatibleRuntime", func() *v1alpha1.Run { return running(policy(3, nil), 1) }, IncompatibleRuntime, false, 0, time.Time{}, v1alpha1.PhaseFailed, IncompatibleRuntime},
		{"InvalidSpec", func() *v1alpha1.Run { return running(policy(3, nil), 1) }, InvalidSpec, false, 0, time.Time{}, v1alpha1.PhaseFailed, InvalidSpec},
		{"IdleTimeout", func() *v1alpha1.Run { return running(policy(3, nil), 1) }, IdleTimeout, false, 0, time.Time{}, v1alpha1.PhaseTimeout, IdleTimeout},
		{"listed IdleTimeout still not", func() *v1alpha1.Run { return running(policy(3, nil, "IdleTimeout"), 1) }, IdleTimeout, false, 0, time.Time{}, v1alpha1.PhaseTimeout, IdleTimeout},
		{"listed InvalidSpec still not", func() *v1alpha1.Run { return running(policy(3, nil, "InvalidSpec"), 1) }, InvalidSpec, false, 0, time.Time{}, v1alpha1.PhaseFailed, InvalidSpec},

		// custom retryableReasons
		{"custom lists NonZeroExit", func() *v1alpha1.Run { return running(policy(3, nil, "NonZeroExit"), 1) }, NonZeroExit, true, 2, t0.Add(time.Second), "", NonZeroExit},
		{"custom lists Timeout", func() *v1alpha1.Run { return running(policy(3, nil, "Timeout"), 2) }, Timeout, true, 3, t0.Add(2 * time.Second), "", Timeout},
		{"custom replaces default", func() *v1alpha1.Run { return running(policy(3, nil, "NonZeroExit"), 1) }, PodGone, false, 0, time.Time{}, v1alpha1.PhaseFailed, PodGone},
		{"custom exhausted", func() *v1alpha1.Run { return running(policy(3, nil, "Timeout"), 3) }, Timeout, false, 0, time.Time{}, v1alpha1.PhaseTimeout, Timeout},

		// cancel
		{"Cancelled", func() *v1alpha1.Run { return running(policy(3, nil), 1) }, Cancelled, false, 0, time.Time{}, v1alpha1.PhaseCancelled, Cancelled},
		{"listed Cancelled still not", func() *v1alpha1.Run { return running(policy(3, nil, "Cancelled"), 1) }, Cancelled, false, 0, time.Time{}, v1alpha1.PhaseCancelled, Cancelled},
		{"cancel requested", func() *v1alpha1.Run {
			r := running(policy(3, nil), 1)
			r.Spec.CancelRequested = true
			return r
		}, PodGone, false, 0, time.Time{}, v1alpha1.PhaseCancelled, Cancelled},

		// terminal Runs stay
		{"already terminal", func() *v1alpha1.Run {
			r := running(policy(3, nil), 1)
			r.Status.Phase, r.Status.Reason, r.Status.Message = v1alpha1.PhaseSucceeded, "", "done"
			return r
		}, PodGone, false, 0, time.Time{}, v1alpha1.PhaseSucceeded, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run := tt.run()
			before := run.DeepCopy()
			d := Decide(run, tt.reason, "boom", t0)
			if d.Retry != tt.retry || d.NextAttempt != tt.next || !d.NotBefore.Equal(tt.notBefore) ||
				d.Phase != tt.phase || d.Reason != tt.wantRsn || !d.At.Equal(t0) {
				t.Errorf("Decide = %+v\nwant retry=%v next=%d notBefore=%v phase=%q reason=%q",
					d, tt.retry, tt.next, tt.notBefore, tt.phase, tt.wantRsn)
			}
			if d.Retry && d.Phase != "" {
				t.Errorf("a retry carries phase %q", d.Phase)
			}
			if !d.Retry && !d.Phase.Terminal() {
				t.Errorf("an end with non-terminal phase %q", d.Phase)
			}
			if len(run.Status.Conditions) != len(before.Status.Conditions) || run.Status.Attempt != before.Status.Attempt {
				t.Error("Decide changed the Run")
			}
		})
	}
}

func TestDecideMessage(t *testing.T) {
	retry := Decide(running(policy(3, dur(2*time.Second)), 1), PodGone, "pod bash-0 stopped heart-beating", t0)
	if want := "attempt 1 of 3 failed, attempt 2 not before 2026-03-04T05:06:09Z: pod bash-0 stopped heart-beating"; retry.Message != want {
		t.Errorf("retry message %q, want %q", retry.Message, want)
	}
	last := Decide(running(policy(3, nil), 3), PodGone, "gone", t0)
	if want := "attempt 3 of 3 failed, no attempts left: gone"; last.Message != want {
		t.Errorf("last message %q, want %q", last.Message, want)
	}
	single := Decide(running(nil, 1), NonZeroExit, "exit status 2", t0)
	if single.Message != "exit status 2" {
		t.Errorf("message %q", single.Message)
	}
	cancel := running(policy(3, nil), 2)
	cancel.Spec.CancelRequested = true
	if got := Decide(cancel, PodGone, "gone", t0).Message; !strings.Contains(got, "PodGone") || !strings.Contains(got, "gone") {
		t.Errorf("cancel message %q does not keep the failure", got)
	}

	for _, tt := range []struct {
		name string
		run  *v1alpha1.Run
	}{{"retry", running(policy(3, nil), 1)}, {"end", running(nil, 1)}} {
		t.Run("bounded "+tt.name, func(t *testing.T) {
			d := Decide(tt.run, PodGone, strings.Repeat("é", bounds.Message), t0)
			if len(d.Message) > bounds.Message || !strings.HasSuffix(d.Message, "[truncated]") {
				t.Errorf("message is %d bytes, bound %d", len(d.Message), bounds.Message)
			}
		})
	}
}

// TestNotBeforeRoundsUp checks that a failure between whole seconds never
// lets the retry start early, and that NotBefore survives the status's JSON
// encoding (whole seconds).
func TestNotBeforeRoundsUp(t *testing.T) {
	now := t0.Add(400 * time.Millisecond)
	run := running(policy(3, dur(1500*time.Millisecond)), 1)
	d := Decide(run, PodGone, "gone", now)
	if want := t0.Add(time.Second + 1500*time.Millisecond); !d.NotBefore.Equal(want) {
		t.Fatalf("NotBefore %v, want %v", d.NotBefore, want)
	}
	if d.NotBefore.Before(now.Add(1500 * time.Millisecond)) {
		t.Fatal("retry could start before the backoff elapsed")
	}
	Apply(run, d)

	data, err := json.Marshal(run)
	if err != nil {
		t.Fatal(err)
	}
	var stored v1alpha1.Run
	if err := json.Unmarshal(data, &stored); err != nil {
		t.Fatal(err)
	}
	got, ok := NotBefore(&stored)
	if !ok || !got.Equal(d.NotBefore) {
		t.Errorf("NotBefore after a store round trip = %v, %v; want %v", got, ok, d.NotBefore)
	}
}

func TestApplyRetry(t *testing.T) {
	run := running(policy(3, dur(4*time.Second)), 1)
	d := Decide(run, RegistrationFailed, "handler did not load", t0)
	Apply(run, d)

	st := run.Status
	if st.Phase != v1alpha1.PhasePending || st.Attempt != 2 || st.Reason != "RegistrationFailed" || st.Message != d.Message {
		t.Errorf("status %+v", st)
	}
	if st.AssignedPod != "" || st.AssignedPodUID != "" || st.StartTime != nil || st.CompletionTime != nil ||
		st.ExitCode != nil || st.Outputs != nil || st.Endpoint != "" {
		t.Errorf("attempt state not cleared: %+v", st)
	}
	for _, ct := range []string{"Scheduled", "Ready"} {
		c := meta.FindStatusCondition(st.Conditions, ct)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != "RegistrationFailed" {
			t.Errorf("%s condition %+v, want False", ct, c)
		}
	}
	c := meta.FindStatusCondition(st.Conditions, ConditionRetrying)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != "RegistrationFailed" || !c.LastTransitionTime.Time.Equal(t0) {
		t.Fatalf("Retrying condition %+v", c)
	}
	if nb, ok := NotBefore(run); !ok || !nb.Equal(t0.Add(4*time.Second)) {
		t.Errorf("NotBefore = %v, %v", nb, ok)
	}

	// The second failure moves the Retrying condition and doubles the delay.
	run.Status.Phase = v1alpha1.PhaseRunning
	later := t0.Add(time.Minute)
	d2 := Decide(run, RegistrationFailed, "again", later)
	Apply(run, d2)
	if run.Status.Attempt != 3 || len(run.Status.Conditions) != 3 {
		t.Errorf("attempt %d, conditions %+v", run.Status.Attempt, run.Status.Conditions)
	}
	if nb, ok := NotBefore(run); !ok || !nb.Equal(later.Add(8*time.Second)) || !nb.Equal(d2.NotBefore) {
		t.Errorf("NotBefore = %v, %v; want %v", nb, ok, later.Add(8*time.Second))
	}

	// The third is the last attempt: the Run ends.
	run.Status.Phase = v1alpha1.PhaseRunning
	end := t0.Add(2 * time.Minute)
	d3 := Decide(run, RegistrationFailed, "still", end)
	Apply(run, d3)
	if run.Status.Phase != v1alpha1.PhaseFailed || run.Status.Attempt != 3 ||
		run.Status.CompletionTime == nil || !run.Status.CompletionTime.Time.Equal(end) {
		t.Errorf("status %+v", run.Status)
	}
	if c := meta.FindStatusCondition(run.Status.Conditions, ConditionRetrying); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("Retrying condition %+v, want False", c)
	}
	if _, ok := NotBefore(run); ok {
		t.Error("an ended Run waits for a retry")
	}
}

func TestApplyEnd(t *testing.T) {
	run := running(nil, 1)
	d := Decide(run, Timeout, "reservation lifetime of 1h0m0s ended", t0)
	Apply(run, d)
	st := run.Status
	if st.Phase != v1alpha1.PhaseTimeout || st.Reason != "Timeout" || st.Message != d.Message ||
		st.CompletionTime == nil || !st.CompletionTime.Time.Equal(t0) {
		t.Errorf("status %+v", st)
	}
	if st.AssignedPod != "bash-0" || st.Attempt != 1 {
		t.Errorf("assignment or attempt changed: %+v", st)
	}
	if meta.FindStatusCondition(st.Conditions, ConditionRetrying) != nil {
		t.Error("an end without a retry added a Retrying condition")
	}

	// Deciding again for the ended Run changes nothing.
	before := run.DeepCopy()
	Apply(run, Decide(run, PodGone, "late reaper", t0.Add(time.Hour)))
	if run.Status.Phase != before.Status.Phase || run.Status.Reason != before.Status.Reason ||
		run.Status.Message != before.Status.Message || !run.Status.CompletionTime.Equal(before.Status.CompletionTime) {
		t.Errorf("terminal Run changed: %+v", run.Status)
	}
}

func TestNotBeforeNotWaiting(t *testing.T) {
	pending := running(nil, 1)
	pending.Status = v1alpha1.RunStatus{Phase: v1alpha1.PhasePending}
	if _, ok := NotBefore(pending); ok {
		t.Error("a first attempt waits for a retry")
	}
	run := running(policy(3, nil), 1)
	Apply(run, Decide(run, PodGone, "gone", t0))
	run.Status.Phase = v1alpha1.PhaseScheduled
	if _, ok := NotBefore(run); ok {
		t.Error("a scheduled Run waits for a retry")
	}
}

func TestDefaultRetryableReasons(t *testing.T) {
	got := DefaultRetryableReasons()
	want := []Reason{RuntimeExecute, RegistrationFailed, ExecutionLost, PodGone, BackendSetupFailed}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	got[0] = "Mutated"
	if DefaultRetryableReasons()[0] != RuntimeExecute {
		t.Error("the default set can be mutated through the returned slice")
	}
}
