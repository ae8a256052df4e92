package up_test

import (
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"
)

// BenchmarkUpScaleFromZero is issue 20's scale-from-zero figure: each
// iteration creates a Function with scale.min 0 (it has no replica), then
// times its first invocation through the Function URL, from the request to
// the answer: the queue wakes the autoscaler, the controller creates a
// replica, the scheduler puts it on a warm pod, it registers and serves.
// Beside it, in the same run, the Function's second (warm) invocation.
// The first call comes right after the create's answer and is made once:
// any answer but 200 fails the benchmark.
//
// A Function scaled to zero has been idle, so its pod's spare Python
// worker (docs/runtime-server.md) has been made again since the last
// registration took one: before each create, outside the timed part, the
// benchmark waits until the pod's spare is idle on its request pipe. How
// long that wait was is reported beside (spare-wait-p50-ms): it is what a
// registration arriving sooner than that after another one waits for.
func BenchmarkUpScaleFromZero(b *testing.B) {
	s := startUp(b)
	var first, warm, spareWait []time.Duration
	for i := range b.N {
		spareWait = append(spareWait, awaitIdleSpares(b))
		name := fmt.Sprintf("zero-%d", i)
		r := s.do(b, http.MethodPost, "/v1/namespaces/default/functions", fmt.Sprintf(`apiVersion: stoke.dev/v1alpha1
kind: Function
metadata: {name: %s}
spec:
  runtime: python
  handler: handler.handle
  source: {inline: {path: handler.py, text: "def handle(event, context):\n    return event\n"}}
  scale: {min: 0, max: 1}
`, name), map[string]string{"Content-Type": "application/yaml"})
		if r.status != http.StatusCreated {
			b.Fatalf("create %s: %s", name, r)
		}
		for _, into := range []*[]time.Duration{&first, &warm} {
			// Called once: the gateway reads a Function its cache has not
			// seen yet from the store, so a 404 here is a real miss.
			start := time.Now()
			r = s.do(b, http.MethodPost, "/v1/namespaces/default/functions/"+name+"/invoke", `{"i":1}`, nil)
			if r.status != http.StatusOK {
				b.Fatalf("invoke %s: %s", name, r)
			}
			*into = append(*into, time.Since(start))
		}
		if r := s.do(b, http.MethodDelete, "/v1/namespaces/default/functions/"+name, "", nil); r.status != http.StatusOK && r.status != http.StatusAccepted {
			b.Fatalf("delete %s: %s", name, r)
		}
	}
	pct := func(lat []time.Duration, q float64) float64 {
		sorted := append([]time.Duration(nil), lat...)
		slices.Sort(sorted)
		return float64(sorted[int(float64(len(sorted)-1)*q)].Microseconds()) / 1000
	}
	b.ReportMetric(pct(first, 0.5), "first-p50-ms")
	b.ReportMetric(pct(first, 0.99), "first-p99-ms")
	b.ReportMetric(pct(warm, 0.5), "warm-p50-ms")
	b.ReportMetric(pct(spareWait, 0.5), "spare-wait-p50-ms")
	b.ReportMetric(0, "ns/op")
}
