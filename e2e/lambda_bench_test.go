package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awslambda "github.com/aws/aws-sdk-go-v2/service/lambda"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/lambda/lambdasim"
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
	sdk := awslambda.New(awslambda.Options{Region: lambdasim.Region, BaseEndpoint: aws.String(sim.URL()),
		Credentials: credentials.NewStaticCredentialsProvider(lambdaAccessKey, "secret", "")})
	ev, _ := json.Marshal(payload.Request{Kind: payload.KindInvoke, Input: json.RawMessage(`{"hello":"world"}`)})
	client := &http.Client{Timeout: 30 * time.Second}
	ctx := context.Background()
	var viaStoke, direct []time.Duration
	for i := range b.N + 10 {
		start := time.Now()
		res := invokeEndpoint(client, u.Token, run.Status.Endpoint, `{"hello":"world"}`)
		d1 := time.Since(start)
		if res.err != nil || res.status != http.StatusOK {
			b.Fatalf("gateway: %d %s %v", res.status, res.body, res.err)
		}
		start = time.Now()
		out, err := sdk.Invoke(ctx, &awslambda.InvokeInput{FunctionName: aws.String(fns[0]), Payload: ev})
		d2 := time.Since(start)
		if err != nil || out.FunctionError != nil {
			b.Fatalf("sdk: %v", err)
		}
		if i >= 10 { // warm-up
			viaStoke, direct = append(viaStoke, d1), append(direct, d2)
		}
	}
	p50 := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds())
	}
	s, d := p50(viaStoke), p50(direct)
	b.ReportMetric(s, "stoke-p50-µs")
	b.ReportMetric(d, "sdk-direct-p50-µs")
	b.ReportMetric(s-d, "overhead-p50-µs")
}
