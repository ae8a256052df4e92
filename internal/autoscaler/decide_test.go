package autoscaler

import (
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

var t0 = time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)

func fnWith(replicas *int32, lo, hi, target, idle int32) *v1alpha1.Function {
	fn := &v1alpha1.Function{}
	fn.Spec.Replicas = replicas
	fn.Spec.Scale = v1alpha1.FunctionScale{Min: lo, Max: hi, TargetInFlight: target, IdleSeconds: idle}
	return fn
}

func ptr(n int32) *int32 { return &n }

const window = 5 * time.Second

// look samples (inFlight, queued) at t and decides.
func look(fn *v1alpha1.Function, st *fnState, t time.Time, inFlight, queued int) decision {
	st.observe(t, inFlight+queued, window)
	return decide(fn, st, t, inFlight, queued, window)
}

func TestDecideScalesUpAtOnce(t *testing.T) {
	for _, c := range []struct {
		name             string
		fn               *v1alpha1.Function
		inFlight, queued int
		want             int
	}{
		{"from zero on the first queued invocation", fnWith(nil, 0, 8, 1, 60), 0, 1, 1},
		{"one replica per invocation", fnWith(ptr(1), 0, 8, 1, 60), 3, 2, 5},
		{"targetInFlight per replica", fnWith(ptr(1), 0, 8, 2, 60), 3, 2, 3},
		{"never above max", fnWith(ptr(2), 0, 8, 1, 60), 8, 92, 8},
		{"max defaults to 8", fnWith(ptr(2), 0, 0, 1, 60), 8, 92, 8},
		{"min kept with no load", fnWith(nil, 2, 8, 1, 60), 0, 0, 2},
		{"spec.replicas below min counts as min", fnWith(ptr(0), 3, 8, 1, 60), 4, 0, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := look(c.fn, &fnState{}, t0, c.inFlight, c.queued)
			if d.to != c.want {
				t.Fatalf("to %d (from %d, %q), want %d", d.to, d.from, d.reason, c.want)
			}
			if d.to != d.from && d.reason == "" {
				t.Error("a change without a reason")
			}
		})
	}
}

// TestDecideScalesDownAfterIdle: fewer replicas only after idleSeconds of
// wanting fewer, to the most wanted meanwhile, never below what is in
// flight; a moment of full load restarts the idle time.
func TestDecideScalesDownAfterIdle(t *testing.T) {
	fn := fnWith(ptr(4), 0, 8, 1, 10)
	st := &fnState{}
	if d := look(fn, st, t0, 1, 0); d.to != 4 || !d.recheck.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("at t0: %+v, want 4 and a recheck at +10s", d)
	}
	// Two in flight for a moment, inside the idle time.
	if d := look(fn, st, t0.Add(3*time.Second), 2, 0); d.to != 4 {
		t.Fatalf("at +3s: %+v", d)
	}
	if d := look(fn, st, t0.Add(9999*time.Millisecond), 1, 0); d.to != 4 {
		t.Fatalf("before idleSeconds: %+v", d)
	}
	d := look(fn, st, t0.Add(10*time.Second), 1, 0)
	if d.to != 2 {
		t.Fatalf("after idleSeconds: %+v, want 2 (the most wanted meanwhile)", d)
	}

	// A break: the load reaches the replicas again, the idle time restarts.
	st = &fnState{}
	look(fn, st, t0, 0, 0)
	if d := look(fn, st, t0.Add(8*time.Second), 4, 0); d.to != 4 {
		t.Fatalf("full load: %+v", d)
	}
	// The peak of 4 stays in the window for 5 s.
	if d := look(fn, st, t0.Add(12*time.Second), 0, 0); d.to != 4 || !d.recheck.IsZero() {
		t.Fatalf("peak still in the window: %+v", d)
	}
	if d := look(fn, st, t0.Add(20*time.Second), 0, 0); d.to != 4 || !d.recheck.Equal(t0.Add(30*time.Second)) {
		t.Fatalf("idle again from +20s: %+v, want a recheck at +30s", d)
	}
	if d := look(fn, st, t0.Add(30*time.Second), 0, 0); d.to != 0 {
		t.Fatalf("idle for 10 s: %+v, want 0", d)
	}
}

func TestDecideNeverBelowInFlightOrMin(t *testing.T) {
	fn := fnWith(ptr(8), 1, 8, 1, 1)
	st := &fnState{}
	look(fn, st, t0, 3, 0)
	if d := look(fn, st, t0.Add(time.Second), 3, 0); d.to != 3 {
		t.Fatalf("%+v, want 3 (in flight)", d)
	}
	st = &fnState{}
	look(fn, st, t0, 0, 0)
	if d := look(fn, st, t0.Add(time.Second), 0, 0); d.to != 1 {
		t.Fatalf("%+v, want 1 (min)", d)
	}
}

func TestSamplesAreBounded(t *testing.T) {
	st := &fnState{}
	for i := range 3 * maxSamples {
		st.observe(t0.Add(time.Duration(i)*time.Microsecond), i, time.Hour)
	}
	if len(st.samples) != maxSamples {
		t.Fatalf("%d samples kept, want %d", len(st.samples), maxSamples)
	}
	st.observe(t0.Add(2*time.Hour), 0, time.Hour)
	if len(st.samples) != 1 {
		t.Fatalf("%d samples kept after the window passed, want 1", len(st.samples))
	}
}
