package up_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/sqlite"
	"stoke.dev/stoke/internal/store/storetest"
	"stoke.dev/stoke/internal/up"
)

// Issue 8's create figures, through a real `stoke up` (in process, real
// pods, its default Runtimes) and its HTTP API. Run with `make bench`.

// defaultRuntimes gives the server the Runtimes `stoke up` starts with.
func defaultRuntimes(c *up.Config) { c.DefaultRuntimes = nil }

// BenchmarkUpCreate200 sends 200 task-Run creates at once, each on a
// connection of its own opened beforehand, and reports the time from
// their release to the last 201 ("all-ms"), and the creates' p50 and p99.
func BenchmarkUpCreate200(b *testing.B) {
	const n = 200
	s := startUp(b, defaultRuntimes)
	var all time.Duration
	var lat []time.Duration
	for i := range b.N {
		clients := make([]*http.Client, n)
		for j := range clients {
			clients[j] = &http.Client{Transport: &http.Transport{}}
			// Open the connection before the clock starts.
			req, _ := http.NewRequest(http.MethodGet, s.url+"/healthz", nil)
			resp, err := clients[j].Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		release := make(chan struct{})
		took := make([]time.Duration, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for j := range n {
			wg.Go(func() {
				body := fmt.Sprintf(`{"metadata":{"name":"c%d-%d"},"spec":{"runtime":"bash","mode":{"task":{"args":["true"]}}}}`, i, j)
				req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/namespaces/default/runs", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+s.token)
				req.Header.Set("Content-Type", "application/json")
				<-release
				start := time.Now()
				resp, err := clients[j].Do(req)
				if err != nil {
					errs[j] = err
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				took[j] = time.Since(start)
				if resp.StatusCode != http.StatusCreated {
					errs[j] = fmt.Errorf("create: status %d", resp.StatusCode)
				}
			})
		}
		start := time.Now()
		close(release)
		wg.Wait()
		all += time.Since(start)
		for _, c := range clients {
			c.CloseIdleConnections()
		}
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		lat = append(lat, took...)
		// Let the Runs finish before the next round.
		s.waitCount(b, fmt.Sprintf("c%d-", i), n)
	}
	slices.Sort(lat)
	pct := func(q float64) float64 { return float64(lat[int(float64(len(lat)-1)*q)].Microseconds()) / 1000 }
	b.ReportMetric(float64(all.Microseconds())/1000/float64(b.N), "all-ms")
	b.ReportMetric(pct(0.5), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(0, "ns/op")
}

// waitCount waits until n Runs named prefix* are terminal.
func (s *server) waitCount(b *testing.B, prefix string, n int) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if failed := <-watchTerminal(b, ctx, s, prefix, n, nil); failed > 0 {
		b.Fatalf("%d of %d Runs did not succeed", failed, n)
	}
}

// BenchmarkUpApply300 runs `stoke apply -f` of a file of 300 `true` task
// Runs against the server and reports Runs/s from the start of the apply
// process to the last Run seen Succeeded on a watch ("runs/s"). Beside it,
// in the same iteration, the floor: the rate at which this machine starts
// and reaps /bin/true from Go with 4 workers ("floor/s"), and Stoke's rate
// as a share of it ("%floor"), and the rate of the apply alone, from its
// start to its exit ("apply-runs/s"). And the ceiling that Stoke's design
// cannot beat here: the rate at which the SQLite store alone takes the
// writes of the same number of task Runs (a create and three status
// writes each) from 32 goroutines, on a store of its own in the same
// iteration ("store/s"), and Stoke's rate as a share of it ("%store").
// The CPU time per Run of this process (stoke up and the watch;
// "up-cpu-ms/run") and of the pods' Runtime Servers ("pod-cpu-ms/run",
// without the tasks' own processes) say what a Run costs, which a busy
// machine moves far less than the rates; and the log says where each
// apply's time went (timeline.stages).
func BenchmarkUpApply300(b *testing.B) {
	const total = 300
	trueBin, err := exec.LookPath("true")
	if err != nil {
		b.Fatal(err)
	}
	s := startUp(b, defaultRuntimes)
	var stoke, apply, floor, ceiling, cpuUp, cpuPods time.Duration
	for i := range b.N {
		prefix := fmt.Sprintf("a%d-", i)
		var manifest strings.Builder
		for n := range total {
			fmt.Fprintf(&manifest, "---\napiVersion: stoke.dev/v1alpha1\nkind: Run\nmetadata: {name: %s%d}\nspec: {runtime: bash, mode: {task: {args: [\"true\"]}}}\n", prefix, n)
		}
		file := filepath.Join(b.TempDir(), "runs.yaml")
		if err := os.WriteFile(file, []byte(manifest.String()), 0o600); err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		tl := &timeline{}
		terminal := watchTerminal(b, ctx, s, prefix, total, tl)
		cmd := exec.Command(stokeBin, "apply", "-f", file)
		cmd.Env = append(os.Environ(), "STOKE_SERVER="+s.url, "STOKE_TOKEN="+s.token)
		before := processUsage(b, os.Getpid(), stokeRole)
		start := time.Now()
		out, err := cmd.CombinedOutput()
		apply += time.Since(start)
		if err != nil {
			cancel()
			b.Fatalf("stoke apply: %v\n%s", err, out)
		}
		failed := <-terminal
		stoke += time.Since(start)
		after := processUsage(b, os.Getpid(), stokeRole)
		cpuUp += after["server"].cpu - before["server"].cpu
		cpuPods += after["pod"].cpu - before["pod"].cpu
		cancel()
		if failed > 0 {
			b.Fatalf("%d of %d Runs did not succeed", failed, total)
		}
		b.Logf("apply %d: %s", i, tl.stages())
		floor += trueFloor(b, trueBin, total, 4)
		ceiling += storeCeiling(b, total)
	}
	stokeRate := float64(total*b.N) / stoke.Seconds()
	floorRate := float64(total*b.N) / floor.Seconds()
	storeRate := float64(total*b.N) / ceiling.Seconds()
	b.ReportMetric(stokeRate, "runs/s")
	b.ReportMetric(floorRate, "floor/s")
	b.ReportMetric(100*stokeRate/floorRate, "%floor")
	b.ReportMetric(storeRate, "store/s")
	b.ReportMetric(100*stokeRate/storeRate, "%store")
	b.ReportMetric(float64(total*b.N)/apply.Seconds(), "apply-runs/s")
	b.ReportMetric(float64(cpuUp.Microseconds())/1000/float64(total*b.N), "up-cpu-ms/run")
	b.ReportMetric(float64(cpuPods.Microseconds())/1000/float64(total*b.N), "pod-cpu-ms/run")
	b.ReportMetric(0, "ns/op")
}

// trueFloor starts and reaps bin n times with the given number of workers
// and returns how long it took.
func trueFloor(b *testing.B, bin string, n, workers int) time.Duration {
	jobs := make(chan struct{}, n)
	for range n {
		jobs <- struct{}{}
	}
	close(jobs)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for range jobs {
				if err := exec.Command(bin).Run(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return took
}

// storeCeiling makes n task Runs' writes (storetest.Lifecycles) through a
// fresh SQLite store with one watcher draining it, as stoke up's informer
// does, from 32 goroutines, and returns how long they took.
func storeCeiling(b *testing.B, n int) time.Duration {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	w, err := st.Runs().Watch(ctx, store.WatchOptions{})
	if err != nil {
		b.Fatal(err)
	}
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for range w.Events() {
		}
	}()
	defer func() {
		w.Stop()
		<-drained
	}()
	took, err := storetest.Lifecycles(ctx, st.Runs(), "ceiling-", n, 32)
	if err != nil {
		b.Fatal(err)
	}
	return took
}
