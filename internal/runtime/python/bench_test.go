package python

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"stoke.dev/stoke/internal/runtime"
)

// benchInterpreters are the interpreters the start-up benchmarks compare:
// the resolved python3 as it is installed here (its site-packages .pth
// files run at every start) and a clean virtual environment made from it,
// which is what a runtime image with its own venv looks like.
func benchInterpreters(b *testing.B) []struct{ name, path string } {
	b.Helper()
	interp := testInterpreter(b)
	list := []struct{ name, path string }{{"python3", interp}}
	venv := filepath.Join(b.TempDir(), "venv")
	if out, err := exec.Command(interp, "-m", "venv", "--without-pip", venv).CombinedOutput(); err != nil {
		b.Logf("no clean venv, skipping it: %v: %s", err, out)
		return list
	}
	return append(list, struct{ name, path string }{"venv", filepath.Join(venv, "bin", "python3")})
}

// reportPercentiles reports the p50 and p99 of lat in unit (µs or ms).
func reportPercentiles(b *testing.B, lat []time.Duration, unit string) {
	b.Helper()
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	scale := map[string]float64{"µs": 1e3, "ms": 1e6}[unit]
	at := func(q int) float64 { return float64(lat[min(len(lat)-1, len(lat)*q/100)].Nanoseconds()) / scale }
	b.ReportMetric(at(50), "p50-"+unit)
	b.ReportMetric(at(99), "p99-"+unit)
}

// BenchmarkInvokeEcho measures one invocation of a warm echo handler at the
// adapter: request framing, the worker's decode/call/encode, the response.
func BenchmarkInvokeEcho(b *testing.B) {
	dir := writeHandlers(b, map[string]string{"handler.py": echoHandler})
	inst := loadSpec(b, New(Config{Interpreter: testInterpreter(b)}), testSpec(b, dir, "handler.handle", nil, nil))
	input := []byte(`{"command":"status"}`)
	lat := make([]time.Duration, 0, 1<<16)
	for b.Loop() {
		start := time.Now()
		// A fresh timeout per call, as the core does.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		deadline, _ := ctx.Deadline()
		res, err := inst.Invoke(ctx, runtime.Invocation{ID: "inv-bench", RunUID: "run-test", Input: input, Deadline: deadline})
		cancel()
		lat = append(lat, time.Since(start))
		inst.Finish() // after the answer, as the core does
		if err != nil || !bytes.Equal(res.Output, input) {
			b.Fatalf("Invoke = %q, %v", res.Output, err)
		}
	}
	reportPercentiles(b, lat, "µs")
}

// BenchmarkLoad measures Load until the worker is ready (process start,
// interpreter start-up, import of the handler); Close is not timed.
func BenchmarkLoad(b *testing.B) {
	dir := writeHandlers(b, map[string]string{"handler.py": echoHandler})
	for _, interp := range benchInterpreters(b) {
		b.Run(interp.name, func(b *testing.B) {
			a := New(Config{Interpreter: interp.path})
			spec := testSpec(b, dir, "handler.handle", nil, nil)
			var lat []time.Duration
			for b.Loop() {
				start := time.Now()
				inst, err := a.Load(context.Background(), spec)
				lat = append(lat, time.Since(start))
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				_ = inst.Close()
				b.StartTimer()
			}
			reportPercentiles(b, lat, "ms")
		})
	}
}

// BenchmarkIdleMemory starts idleWorkers warm workers (each invoked once)
// and reports their average RSS and PSS from /proc/<pid>/smaps_rollup.
func BenchmarkIdleMemory(b *testing.B) {
	const idleWorkers = 8
	dir := writeHandlers(b, map[string]string{"handler.py": echoHandler})
	for _, interp := range benchInterpreters(b) {
		b.Run(interp.name, func(b *testing.B) {
			rss, pss := idleMemory(b, interp.path, dir, idleWorkers)
			for b.Loop() {
			}
			b.ReportMetric(rss, "RSS-MiB/worker")
			b.ReportMetric(pss, "PSS-MiB/worker")
		})
	}
}

// idleMemory loads n workers of dir's echo handler with interpreter, invokes
// each once, and returns their average RSS and PSS in MiB.
func idleMemory(tb testing.TB, interpreter, dir string, n int) (rss, pss float64) {
	tb.Helper()
	a := New(Config{Interpreter: interpreter})
	rec := newRecorder()
	var insts []*instance
	for range n {
		inst := loadSpec(tb, a, testSpec(tb, dir, "handler.handle", rec, nil))
		if _, err := invoke(tb, inst, rec, "inv-warm", `{"warm":true}`); err != nil {
			tb.Fatal(err)
		}
		insts = append(insts, inst)
	}
	for _, inst := range insts {
		r, p := smapsRollup(tb, inst.p.Pid())
		rss += r
		pss += p
	}
	return rss / float64(n) / 1024, pss / float64(n) / 1024
}

// smapsRollup returns a process's Rss and Pss in KiB.
func smapsRollup(tb testing.TB, pid int) (rss, pss float64) {
	tb.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		v, err := strconv.ParseFloat(fields[1], 64)
		if err != nil {
			continue
		}
		switch fields[0] {
		case "Rss:":
			rss = v
		case "Pss:":
			pss = v
		}
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return rss, pss
}
