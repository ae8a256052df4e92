// Package gctarget sets a process's garbage collection target so that it
// rises only while the heap is small: GOGC is Percent (400), and a soft
// memory limit (runtime/debug.SetMemoryLimit) that follows the live heap
// holds the process to about what Go's default (GOGC=100) would let it
// use once that is more than Floor. A small heap thus collects several
// times less often, while what a client can make the process hold grows
// no faster than at Go's default. The limit is re-evaluated from
// runtime/metrics on a ticker and is never set under twice the live heap
// it reads, so the collector does not run back to back because of it
// (unless the heap more than doubles between two readings).
//
// When the environment sets GOGC or GOMEMLIMIT the operator has decided,
// and Start changes nothing.
//
// No process calls Start yet: measured in stoke up and its Runtime
// Servers, it cut their collections about four-fold but the warm
// invocation's latency over its floor did not improve, and rose in most
// runs (docs/benchmarks.md, "GC target that follows the live heap"). A
// process's start-up turns it on with
//
//	defer gctarget.Start(ctx, gctarget.Config{LookupEnv: os.LookupEnv})()
package gctarget

import (
	"context"
	"log/slog"
	"math"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

const (
	// Percent is GOGC while the memory limit does not bind.
	Percent = 400
	// Floor is the least memory limit, in bytes of the runtime's memory
	// (what GOMEMLIMIT counts).
	Floor = 64 << 20
	// Interval is how often the limit follows the live heap.
	Interval = time.Second
)

// Config is what Start needs. LookupEnv is required; the other zero
// fields take the defaults above.
type Config struct {
	// LookupEnv reads the environment (os.LookupEnv outside tests).
	LookupEnv func(string) (string, bool)
	// Logger logs the start and the stop at debug level (nil: none).
	Logger *slog.Logger
	// NewTicker makes the ticker (nil: time.NewTicker's).
	NewTicker func(time.Duration) (<-chan time.Time, func())
	Percent   int
	Floor     int64
	Interval  time.Duration
}

// Sample is what the limit is computed from, in bytes, as
// runtime/metrics reports it.
type Sample struct {
	// Live is the heap that survived the last collection
	// (/gc/heap/live:bytes).
	Live uint64
	// Roots are the stacks and globals a collection scans
	// (/gc/scan/stack:bytes + /gc/scan/globals:bytes), which GOGC
	// counts with the live heap.
	Roots uint64
	// NonHeap is the runtime's memory that GOMEMLIMIT counts beside
	// the heap's objects and free pages: stacks, metadata, fragmentation
	// (/memory/classes/total - heap/released - heap/objects - heap/free).
	NonHeap uint64
}

// Limit is the memory limit for s: what GOGC=100 would let the runtime
// use (the live heap, again the live heap and the roots, the non-heap
// memory), or floor when that is more. It is never under twice s.Live.
func Limit(s Sample, floor int64) int64 {
	want := 2*s.Live + s.Roots + s.NonHeap
	if want > math.MaxInt64 {
		return math.MaxInt64
	}
	return max(floor, int64(want))
}

// Enabled says whether the environment leaves the target to this
// package: neither GOGC nor GOMEMLIMIT is set.
func Enabled(lookupEnv func(string) (string, bool)) bool {
	for _, k := range []string{"GOGC", "GOMEMLIMIT"} {
		if _, set := lookupEnv(k); set {
			return false
		}
	}
	return true
}

// Start sets GOGC to cfg.Percent and the memory limit to Limit of the
// current sample, then re-evaluates the limit every cfg.Interval until
// ctx ends or stop is called. stop waits for that goroutine and puts Go's
// defaults back (GOGC=100, no limit). When Enabled is false it does
// nothing and stop does nothing.
func Start(ctx context.Context, cfg Config) (stop func()) {
	if !Enabled(cfg.LookupEnv) {
		return func() {}
	}
	if cfg.Percent == 0 {
		cfg.Percent = Percent
	}
	if cfg.Floor == 0 {
		cfg.Floor = Floor
	}
	if cfg.Interval == 0 {
		cfg.Interval = Interval
	}
	if cfg.NewTicker == nil {
		cfg.NewTicker = func(d time.Duration) (<-chan time.Time, func()) {
			t := time.NewTicker(d)
			return t.C, t.Stop
		}
	}
	r := newReader()
	// The limit first, so that the higher target never runs without it.
	debug.SetMemoryLimit(Limit(r.read(), cfg.Floor))
	debug.SetGCPercent(cfg.Percent)
	if cfg.Logger != nil {
		cfg.Logger.Debug("gc target follows the live heap", "gogc", cfg.Percent, "floor", cfg.Floor, "interval", cfg.Interval)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	tick, stopTicker := cfg.NewTicker(cfg.Interval)
	go func() {
		defer close(done)
		defer stopTicker()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick:
				debug.SetMemoryLimit(Limit(r.read(), cfg.Floor))
			}
		}
	}()
	return func() {
		cancel()
		<-done
		debug.SetGCPercent(100)
		debug.SetMemoryLimit(math.MaxInt64)
	}
}

// reader reads a Sample, reusing its metrics slice.
type reader struct{ s []metrics.Sample }

const (
	mLive     = "/gc/heap/live:bytes"
	mStack    = "/gc/scan/stack:bytes"
	mGlobals  = "/gc/scan/globals:bytes"
	mTotal    = "/memory/classes/total:bytes"
	mReleased = "/memory/classes/heap/released:bytes"
	mObjects  = "/memory/classes/heap/objects:bytes"
	mFree     = "/memory/classes/heap/free:bytes"
)

func newReader() *reader {
	names := []string{mLive, mStack, mGlobals, mTotal, mReleased, mObjects, mFree}
	r := &reader{s: make([]metrics.Sample, len(names))}
	for i, n := range names {
		r.s[i].Name = n
	}
	return r
}

func (r *reader) read() Sample {
	metrics.Read(r.s)
	v := func(i int) uint64 {
		if r.s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return r.s[i].Value.Uint64()
	}
	live, stack, globals, total, released, objects, free := v(0), v(1), v(2), v(3), v(4), v(5), v(6)
	var nonHeap uint64
	if used := released + objects + free; total > used {
		nonHeap = total - used
	}
	return Sample{Live: live, Roots: stack + globals, NonHeap: nonHeap}
}
