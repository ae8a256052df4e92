package up_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/up"
)

// The figures issue 4 asks for, through a real `stoke up` (in process, real
// pods) and its HTTP API. Run with `make bench`.

func report(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	pct := func(q float64) float64 { return float64(lat[int(float64(len(lat)-1)*q)].Microseconds()) / 1000 }
	b.ReportMetric(pct(0.5), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(0, "ns/op")
}

// benchInvoke measures sequential invocations of a trivial echo function
// through the gateway (HTTP client → gateway → runtimed proxy hop →
// Runtime Server over its Unix socket → warm handler → back).
func benchInvoke(b *testing.B, manifest string) {
	s := startUp(b)
	fn := s.create(b, manifest)
	fn = s.waitPhase(b, fn.Name, v1alpha1.PhaseReady)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	call := func() {
		req, _ := http.NewRequest(http.MethodPost, fn.Status.Endpoint, strings.NewReader(`{"command":"status"}`))
		req.Header.Set("Authorization", "Bearer "+s.token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	measureCalls(b, 50, call)
}

func BenchmarkUpInvokePython(b *testing.B) {
	benchInvoke(b, `apiVersion: stoke.dev/v1alpha1
kind: Run
metadata: {name: echo-py}
spec:
  runtime: python
  mode: {function: {handler: echo.handle}}
  source: {inline: {path: echo.py, text: "def handle(event):\n    return event\n"}}
`)
}

func BenchmarkUpInvokeBash(b *testing.B) {
	benchInvoke(b, `apiVersion: stoke.dev/v1alpha1
kind: Run
metadata: {name: echo-sh}
spec:
  runtime: bash
  mode: {function: {handler: handler.handle}}
  source: {inline: {path: handler.sh, text: "handle() { printf '%s' \"$1\"; }\n"}}
`)
}

// BenchmarkUpTasks300 applies 300 `true` tasks at once through the HTTP
// API (32 connections) and reports Runs/s from the first create to the
// last Run seen terminal on a watch stream.
func BenchmarkUpTasks300(b *testing.B) {
	const total, conns = 300, 32
	s := startUp(b, func(c *up.Config) {
		oneOfEach(c)
		c.DefaultRuntimes[0].Spec.Replicas, c.DefaultRuntimes[0].Spec.Runs = 2, 64
	})
	var elapsed time.Duration
	for i := range b.N {
		prefix := fmt.Sprintf("b%d-", i)
		ctx, cancel := context.WithCancel(context.Background())
		terminal := watchTerminal(b, ctx, s, prefix, total, nil)
		start := time.Now()
		names := make(chan int)
		var wg sync.WaitGroup
		for range conns {
			wg.Go(func() {
				for n := range names {
					r := s.do(b, http.MethodPost, "/v1/namespaces/default/runs", fmt.Sprintf(
						`{"metadata":{"name":"%s%d"},"spec":{"runtime":"bash","mode":{"task":{"args":["true"]}}}}`, prefix, n), nil)
					if r.status != http.StatusCreated {
						b.Errorf("create: %s", r)
					}
				}
			})
		}
		for n := range total {
			names <- n
		}
		close(names)
		wg.Wait()
		failed := <-terminal
		elapsed += time.Since(start)
		cancel()
		if failed > 0 {
			b.Fatalf("%d of %d Runs did not succeed", failed, total)
		}
	}
	b.ReportMetric(float64(total*b.N)/elapsed.Seconds(), "runs/s")
	b.ReportMetric(0, "ns/op")
}

// watchTerminal watches Runs named prefix* until total are terminal and
// sends how many of them did not succeed. A non-nil tl records when the
// watch first saw each Run in each phase.
func watchTerminal(b *testing.B, ctx context.Context, s *server, prefix string, total int, tl *timeline) <-chan int {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/v1/namespaces/default/runs?watch=true", nil)
	req.Header.Set("Authorization", "Bearer "+s.token)
	resp, err := s.client.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	out := make(chan int, 1)
	go func() {
		defer resp.Body.Close()
		seen, failed := map[string]bool{}, 0
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 8<<20)
		for sc.Scan() {
			var ev struct{ Object v1alpha1.Run }
			if json.Unmarshal(sc.Bytes(), &ev) != nil || !strings.HasPrefix(ev.Object.Name, prefix) {
				continue
			}
			if tl != nil {
				tl.saw(&ev.Object, time.Now())
			}
			if !ev.Object.Status.Phase.Terminal() || seen[ev.Object.Name] {
				continue
			}
			seen[ev.Object.Name] = true
			if ev.Object.Status.Phase != v1alpha1.PhaseSucceeded {
				failed++
			}
			if len(seen) == total {
				out <- failed
				return
			}
		}
		out <- total - len(seen) + failed
	}()
	return out
}

// measureCalls makes warm calls untimed, then b.N timed ones, and reports
// their latency percentiles.
func measureCalls(b *testing.B, warm int, call func()) {
	for range warm {
		call()
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		call()
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	report(b, lat)
}
