package up_test

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/testbin"
)

// sleepModule is a 10 ms I/O-bound handler.
const sleepModule = "import time\n\ndef handle(event):\n    time.sleep(0.01)\n    return event\n"

// BenchmarkUpFunctionThroughput is issue 20's throughput figure: 64
// clients, each calling back to back over keep-alive HTTP from this
// process, through a `stoke up` child's Function URL, for
// STOKE_BENCH_SECONDS (default 10) per target: a Function of 8 replicas
// (max 8) beside one of 1 replica measured the same way in the same run.
// Every call must answer 200: a refusal fails the benchmark.
func BenchmarkUpFunctionThroughput(b *testing.B) {
	u, err := testbin.StartUp(stokeBin, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := u.Stop(); err != nil {
			b.Error(err)
		}
	})
	s := &server{url: u.URL, token: u.Token, client: &http.Client{Transport: &http.Transport{}}}
	defer s.client.CloseIdleConnections()
	for fn, n := range map[string]int{"sleep8": 8, "sleep1": 1} {
		for i := range n {
			s.create(b, fmt.Sprintf(`apiVersion: stoke.dev/v1alpha1
kind: Run
metadata: {name: %s-%d, labels: {%s: %s}}
spec:
  runtime: python
  mode: {function: {handler: sleeper.handle}}
  source: {inline: {path: sleeper.py, text: %q}}
`, fn, i, v1alpha1.LabelFunction, fn, sleepModule))
		}
		for i := range n {
			s.waitPhase(b, fmt.Sprintf("%s-%d", fn, i), v1alpha1.PhaseReady)
		}
	}
	secs := 10 * time.Second
	if d, err := time.ParseDuration(envOr("STOKE_BENCH_SECONDS", "10") + "s"); err == nil && d > 0 {
		secs = d
	}
	const clients = 64
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	defer client.CloseIdleConnections()
	rate := func(fn string) float64 {
		url := u.URL + "/v1/namespaces/default/functions/" + fn + "/invoke"
		var done atomic.Int64
		deadline := time.Now().Add(secs)
		var wg sync.WaitGroup
		start := time.Now()
		for c := range clients {
			wg.Go(func() {
				for i := 0; time.Now().Before(deadline); i++ {
					req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(fmt.Sprintf(`{"c":%d,"i":%d}`, c, i)))
					req.Header.Set("Authorization", "Bearer "+u.Token)
					req.Header.Set("Content-Type", "application/json")
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						b.Errorf("%s: HTTP %d", fn, resp.StatusCode)
						return
					}
					done.Add(1)
				}
			})
		}
		wg.Wait()
		return float64(done.Load()) / time.Since(start).Seconds()
	}
	b.ResetTimer()
	for range b.N {
		b.ReportMetric(rate("sleep8"), "max8-inv/s")
		b.ReportMetric(rate("sleep1"), "one-inv/s")
	}
	b.ReportMetric(0, "ns/op")
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
