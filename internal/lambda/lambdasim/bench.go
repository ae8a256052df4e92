package lambdasim

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
)

// BesideDirect measures via, one invocation of function made some other
// way, beside the same function invoked directly through the SDK with event,
// alternately, b.N times after ten warm-up rounds of each, and reports the
// medians in µs (name-p50-µs, sdk-direct-p50-µs) and their difference
// (overhead-p50-µs): what the other way adds. via fails b on a wrong answer.
func (s *Simulator) BesideDirect(b *testing.B, function string, event []byte, name string, via func()) {
	b.Helper()
	sdk := s.Client()
	ctx := context.Background()
	var other, direct []time.Duration
	for i := range b.N + 10 {
		start := time.Now()
		via()
		d1 := time.Since(start)
		start = time.Now()
		out, err := sdk.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String(function), Payload: event})
		d2 := time.Since(start)
		if err != nil || out.FunctionError != nil {
			b.Fatalf("sdk: %v", err)
		}
		if i >= 10 { // warm-up
			other, direct = append(other, d1), append(direct, d2)
		}
	}
	p50 := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds())
	}
	o, d := p50(other), p50(direct)
	b.ReportMetric(o, name+"-p50-µs")
	b.ReportMetric(d, "sdk-direct-p50-µs")
	b.ReportMetric(o-d, "overhead-p50-µs")
}
