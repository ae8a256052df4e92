package bash

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"stoke.dev/stoke/internal/runtime"
)

// The adapter's latency, without the gRPC hop: back to back, paced (one
// call every 10 ms, so the next child is always forked and idle), and the
// fork-per-call baseline the warm shell replaces. Each reports p50 and p99.
//
//	go test -run '^$' -bench . -benchtime 1000x ./internal/runtime/bash/

const echoHandler = "echo_fn() { printf '%s' \"$1\"; }\n"

const benchInput = `{"command":"status","n":12345}`

func benchInstance(b *testing.B) (*instance, func()) {
	b.Helper()
	f := newFixtureTB(b, map[string]string{"echo.sh": echoHandler})
	spec := f.spec
	spec.Handler = "echo.echo_fn"
	inst, err := New(Config{}).Load(context.Background(), spec)
	if err != nil {
		b.Fatal(err)
	}
	return inst.(*instance), func() { _ = inst.Close() }
}

func invokeOnce(b *testing.B, in *instance) {
	res, err := in.Invoke(context.Background(), runtime.Invocation{ID: "bench", RunUID: "uid-1", Input: []byte(benchInput)})
	if err != nil {
		b.Fatal(err)
	}
	if string(res.Output) != benchInput {
		b.Fatalf("output %q", res.Output)
	}
}

// BenchmarkInvokeEcho invokes back to back: every call also pays for the
// fork of the next child, which then overlaps the next request.
func BenchmarkInvokeEcho(b *testing.B) {
	in, closeFn := benchInstance(b)
	defer closeFn()
	invokeOnce(b, in) // warm up
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		invokeOnce(b, in)
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	reportPercentiles(b, lat)
}

// BenchmarkInvokeEchoPaced invokes once every 10 ms, as a lightly loaded
// function would be: the next child is already forked when a request comes.
func BenchmarkInvokeEchoPaced(b *testing.B) {
	in, closeFn := benchInstance(b)
	defer closeFn()
	invokeOnce(b, in)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		<-tick.C
		t0 := time.Now()
		invokeOnce(b, in)
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	reportPercentiles(b, lat)
}

// BenchmarkForkPerCall is the baseline the warm shell replaces: one bash
// per call that sources the file and calls the function.
func BenchmarkForkPerCall(b *testing.B) {
	f := newFixtureTB(b, map[string]string{"echo.sh": echoHandler})
	bash, err := exec.LookPath("bash")
	if err != nil {
		b.Fatal(err)
	}
	file := filepath.Join(f.dir, "echo.sh")
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		cmd := exec.Command(bash, "--noprofile", "--norc", "-c", `source "$1"; echo_fn "$2"`, "bash", file, benchInput)
		cmd.Dir = f.dir
		cmd.Env = f.spec.Env
		out, err := cmd.Output()
		if err != nil || string(out) != benchInput {
			b.Fatalf("%q %v", out, err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	reportPercentiles(b, lat)
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}
