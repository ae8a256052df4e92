package e2e

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/lambda/payload"
	"stoke.dev/stoke/internal/testbin"
)

// BenchmarkLambdaInvoke measures a warm invocation through the whole path
// (gateway → runtimed → lambda Runtime Server → simulator → RIE →
// bootstrap → Python handler) and, interleaved in the same run, the same
// function invoked directly through the SDK against the simulator; the
// difference of the medians is Stoke's share.
func BenchmarkLambdaInvoke(b *testing.B) {
	sim := startLambda(b, 100)
	up, err := testbin.StartUp(stokeBin, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { up.Close() })
	u := &stokeUp{Up: up}
	u.applyLambdaRuntime(b, "lambda-python", "python", "")
	if status, body, err := u.request(http.MethodPost, "/v1/namespaces/default/runs",
		newRun("echo", function("lambda-python", "m.handle", "m.py", "def handle(event):\n    return event\n"))); err != nil || status != http.StatusCreated {
		b.Fatalf("create: %d %s %v", status, body, err)
	}
	var run v1alpha1.Run
	deadline := time.Now().Add(3 * time.Minute)
	for run.Status.Phase != v1alpha1.PhaseReady {
		if time.Now().After(deadline) || run.Status.Phase.Terminal() {
			b.Fatalf("echo: %s %s", run.Status.Phase, run.Status.Message)
		}
		time.Sleep(100 * time.Millisecond) // setup only: polls the Run until Ready
		_, body, err := u.request(http.MethodGet, "/v1/namespaces/default/runs/echo", nil)
		if err != nil || json.Unmarshal(body, &run) != nil {
			b.Fatalf("get: %s %v", body, err)
		}
	}
	fns := sim.Functions()
	if len(fns) != 1 {
		b.Fatalf("functions %v", fns)
	}
	ev, _ := json.Marshal(payload.Request{Kind: payload.KindInvoke, Input: json.RawMessage(`{"hello":"world"}`)})
	client := &http.Client{Timeout: 30 * time.Second}
	sim.BesideDirect(b, fns[0], ev, "stoke", func() {
		res := invokeEndpoint(client, u.Token, run.Status.Endpoint, `{"hello":"world"}`)
		if res.err != nil || res.status != http.StatusOK {
			b.Fatalf("gateway: %d %s %v", res.status, res.body, res.err)
		}
	})
}
