package autoscaler

import (
	"context"
	"fmt"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/functionset"
	"stoke.dev/stoke/internal/informer"
)

// sync samples one Function and decides its desired count.
func (a *Autoscaler) sync(ctx context.Context, k informer.Key) {
	fn, ok := a.cfg.FunctionInformer.Get(k.Namespace, k.Name)
	st := a.fns[k]
	if !ok || fn.DeletionTimestamp != nil || (st != nil && st.uid != string(fn.UID)) {
		if st != nil && !st.busy {
			delete(a.fns, k)
		}
		if !ok || fn.DeletionTimestamp != nil {
			return
		}
		st = nil
	}
	if st == nil {
		st = &fnState{uid: string(fn.UID)}
		a.fns[k] = st
	}
	if st.busy || st.holdRV == fn.ResourceVersion {
		return
	}
	st.holdRV = ""
	now := a.clk.Now()
	inFlight, queued := a.load(fn)
	st.observe(now, inFlight+queued, a.cfg.Window)
	if now.Before(st.retryAt) {
		a.loop.After(st.retryAt, k)
		return
	}
	d := decide(fn, st, now, inFlight, queued, a.cfg.Window)
	switch {
	case d.to != d.from:
		st.lowSince, st.lowPeak = time.Time{}, 0
		a.write(ctx, k, fn, st, d)
		return
	case !d.recheck.IsZero():
		a.loop.After(d.recheck, k)
	}
	lo, _, _ := scaleOf(fn)
	if st.peak() > 0 || d.from > lo || !st.lowSince.IsZero() {
		// Not at rest: sample again.
		a.loop.After(now.Add(a.cfg.SamplePeriod), k)
	} else if len(st.samples) > 0 && now.Sub(st.samples[len(st.samples)-1].at) >= a.cfg.Window {
		delete(a.fns, k)
	}
}

// observe adds a sample and drops those older than the window (keeping
// the newest).
func (st *fnState) observe(now time.Time, load int, window time.Duration) {
	st.samples = append(st.samples, sample{at: now, load: load})
	cut := 0
	for cut < len(st.samples)-1 && now.Sub(st.samples[cut].at) > window {
		cut++
	}
	cut = max(cut, len(st.samples)-maxSamples)
	if cut > 0 {
		st.samples = append(st.samples[:0], st.samples[cut:]...)
	}
}

// peak is the largest load in the window.
func (st *fnState) peak() int {
	p := 0
	for _, s := range st.samples {
		p = max(p, s.load)
	}
	return p
}

// decision is one look at a Function.
type decision struct {
	from, to int
	reason   string
	at       time.Time
	// recheck, when set, is when the decision may change with no new
	// sample (the end of the idle time).
	recheck time.Time
}

// decide is the policy: up at once, down after idleSeconds of wanting
// fewer, never below what is in flight.
func decide(fn *v1alpha1.Function, st *fnState, now time.Time, inFlight, queued int, window time.Duration) decision {
	lo, hi, target := scaleOf(fn)
	cur := functionset.Desired(fn)
	peak := st.peak()
	want := max(lo, min(ceilDiv(peak, target), hi))
	d := decision{from: cur, to: cur, at: now}
	switch {
	case want > cur:
		d.to = want
		d.reason = fmt.Sprintf("%d in flight + %d queued now, peak %d over %v, target %d per replica",
			inFlight, queued, peak, window, target)
		st.lowSince = time.Time{}
	case want < cur:
		if st.lowSince.IsZero() {
			st.lowSince, st.lowPeak = now, want
		}
		st.lowPeak = max(st.lowPeak, want)
		idle := idleOf(fn)
		if due := st.lowSince.Add(idle); now.Before(due) {
			d.recheck = due
			return d
		}
		floor := ceilDiv(inFlight, target)
		d.to = max(lo, min(max(st.lowPeak, floor), hi))
		d.reason = fmt.Sprintf("at most %d wanted for %v (peak load %d, %d in flight now), target %d per replica",
			st.lowPeak, idle, st.lowPeak*target, inFlight, target)
		if d.to >= cur {
			d.to = cur
			st.lowSince = time.Time{}
		}
	default:
		st.lowSince = time.Time{}
	}
	return d
}
