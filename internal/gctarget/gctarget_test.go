package gctarget

import (
	"context"
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

func TestLimit(t *testing.T) {
	const floor = 64 << 20
	for _, tt := range []struct {
		name string
		s    Sample
		want int64
	}{
		{"a small heap gets the floor", Sample{Live: 10 << 20, Roots: 1 << 20, NonHeap: 8 << 20}, floor},
		{"a large heap gets what GOGC=100 allows", Sample{Live: 100 << 20, Roots: 1 << 20, NonHeap: 8 << 20}, 209 << 20},
		{"at the edge", Sample{Live: 28 << 20, NonHeap: 8 << 20}, floor},
		{"an absurd heap saturates", Sample{Live: math.MaxUint64 / 2}, math.MaxInt64},
	} {
		if got := Limit(tt.s, floor); got != tt.want {
			t.Errorf("%s: Limit(%+v) = %d, want %d", tt.name, tt.s, got, tt.want)
		}
		if got := Limit(tt.s, floor); uint64(got) < min(2*tt.s.Live, math.MaxInt64) {
			t.Errorf("%s: Limit(%+v) = %d, under twice the live heap", tt.name, tt.s, got)
		}
	}
}

// settings reads GOGC and the memory limit as the runtime has them.
func settings() (gogc, limit uint64) {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/gomemlimit:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64(), s[1].Value.Uint64()
}

// restoreDefaults puts Go's defaults back after the test, whatever it did.
func restoreDefaults(t *testing.T) {
	t.Helper()
	debug.SetGCPercent(100)
	debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() {
		debug.SetGCPercent(100)
		debug.SetMemoryLimit(math.MaxInt64)
	})
}

func noEnv(string) (string, bool) { return "", false }

// manualTicker is a ticker the test drives. tick sends twice: the loop
// takes one tick at a time, so once the second is taken the first has
// been acted on.
type manualTicker struct {
	c       chan time.Time
	stopped chan struct{}
}

func newManualTicker() *manualTicker {
	return &manualTicker{c: make(chan time.Time), stopped: make(chan struct{})}
}

func (m *manualTicker) new(time.Duration) (<-chan time.Time, func()) {
	return m.c, func() { close(m.stopped) }
}

func (m *manualTicker) tick() {
	m.c <- time.Time{}
	m.c <- time.Time{}
}

var sink [][]byte

func TestStartFollowsTheLiveHeap(t *testing.T) {
	restoreDefaults(t)
	const floor = 16 << 20
	m := newManualTicker()
	stop := Start(context.Background(), Config{LookupEnv: noEnv, NewTicker: m.new, Floor: floor})
	defer stop()

	gogc, limit := settings()
	if gogc != Percent || limit < floor {
		t.Fatalf("after Start: GOGC %d, limit %d; want %d and at least %d", gogc, limit, Percent, floor)
	}

	// 128 MiB that stays live: the limit rises to at least twice it.
	const big = 128 << 20
	for range big >> 20 {
		sink = append(sink, make([]byte, 1<<20))
	}
	runtime.GC()
	m.tick()
	if _, limit := settings(); limit < 2*big {
		t.Errorf("with %d MiB live the limit is %d MiB, want at least %d MiB", big>>20, limit>>20, 2*big>>20)
	}

	// Dropped again: it falls back towards the floor.
	sink = nil
	runtime.GC()
	m.tick()
	live := newReader().read().Live
	_, limit = settings()
	if limit >= big || limit < floor || limit < 2*live {
		t.Errorf("with %d MiB live again the limit is %d MiB, want under %d MiB, at least the floor (%d MiB) and twice the live heap", live>>20, limit>>20, big>>20, floor>>20)
	}
}

func TestStopPutsGoDefaultsBack(t *testing.T) {
	restoreDefaults(t)
	m := newManualTicker()
	ctx, cancel := context.WithCancel(context.Background())
	stop := Start(ctx, Config{LookupEnv: noEnv, NewTicker: m.new})
	cancel()
	select {
	case <-m.stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the ticker was not stopped when the context ended")
	}
	stop()
	if gogc, limit := settings(); gogc != 100 || limit != math.MaxInt64 {
		t.Errorf("after stop: GOGC %d, limit %d; want 100 and none", gogc, limit)
	}
}

func TestTheOperatorsSettingsWin(t *testing.T) {
	for _, k := range []string{"GOGC", "GOMEMLIMIT"} {
		t.Run(k, func(t *testing.T) {
			restoreDefaults(t)
			debug.SetGCPercent(150)
			env := func(name string) (string, bool) { return "150", name == k }
			m := newManualTicker()
			stop := Start(context.Background(), Config{LookupEnv: env, NewTicker: m.new})
			if gogc, limit := settings(); gogc != 150 || limit != math.MaxInt64 {
				t.Errorf("with %s set: GOGC %d, limit %d; want 150 and none", k, gogc, limit)
			}
			stop()
			if gogc, _ := settings(); gogc != 150 {
				t.Errorf("with %s set, stop changed GOGC to %d", k, gogc)
			}
			select {
			case m.c <- time.Time{}:
				t.Errorf("with %s set a loop took a tick", k)
			default:
			}
		})
	}
}
