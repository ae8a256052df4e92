package server_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/metricsrpc"
	"stoke.dev/stoke/internal/runtime/runtimetest"
)

// metricValue is the value of the series of family name whose labels
// include want, and whether there is one.
func metricValue(mfs []*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if have[k] != v {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue(), true
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue(), true
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount()), true
			}
		}
	}
	return 0, false
}

// The Runtime Server's metrics, scraped over its own gRPC connection:
// invocations by result and their durations, the one in flight, and the
// registrations by state.
func TestMetricsOverGRPC(t *testing.T) {
	srv := runtimetest.StartServer(t, runtimetest.Harness{Runtime: "bash"}, nil)
	src := runtimetest.Source{Handler: "h.handle", Files: map[string]string{"h.sh": `
handle() {
	case "$1" in
	'"fail"') echo broken >&2; exit 3 ;;
	'"block"') read -r _ < gate ;;
	esac
	printf '%s' "$1"
}
`}}
	dir := srv.Dir(t, src)
	if err := unix.Mkfifo(filepath.Join(dir, "gate"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := srv.Functions.RegisterFunction(ctx, &pb.RegisterFunctionRequest{RunUid: "metrics-fn", RegistrationAttempt: 1,
		WorkingDir: dir, Handler: src.Handler, IdleTimeoutSeconds: 300, RegistrationDigest: runtimetest.Digest("m")})
	if err != nil || resp.GetState() != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
		t.Fatalf("register: %v %v", resp, err)
	}
	reg := resp.GetRegistration()
	if _, err := srv.Invoke(ctx, reg, `"a"`, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Invoke(ctx, reg, `"b"`, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Invoke(ctx, reg, `"fail"`, 0); err == nil {
		t.Fatal("the failing call succeeded")
	}

	// One call in flight: its handler has opened the FIFO once the open
	// for writing returns.
	errc := make(chan error, 1)
	go func() {
		_, err := srv.Invoke(ctx, reg, `"block"`, 0)
		errc <- err
	}()
	gate, err := os.OpenFile(filepath.Join(dir, "gate"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := metricsrpc.Scrape(ctx, srv.Conn)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	_, _ = gate.WriteString("go\n")
	gate.Close()
	if err := <-errc; err != nil {
		t.Fatalf("blocked call: %v", err)
	}

	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"stoke_runtime_invocations_total", map[string]string{"result": "ok"}, 2},
		{"stoke_runtime_invocations_total", map[string]string{"result": "function_error"}, 1},
		{"stoke_runtime_invocation_duration_seconds", map[string]string{"result": "ok"}, 2},
		{"stoke_runtime_invocations_in_flight", nil, 1},
		{"stoke_runtime_registrations", map[string]string{"state": "ready"}, 1},
		{"stoke_runtime_registrations", map[string]string{"state": "failed"}, 0},
	} {
		if got, ok := metricValue(mfs, c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}

	// After the call, nothing is in flight and the ok count has grown.
	mfs, err = metricsrpc.Scrape(ctx, srv.Conn)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := metricValue(mfs, "stoke_runtime_invocations_in_flight", nil); got != 0 {
		t.Errorf("in flight after the call: %v", got)
	}
	if got, _ := metricValue(mfs, "stoke_runtime_invocations_total", map[string]string{"result": "ok"}); got != 3 {
		t.Errorf("ok invocations after the call: %v, want 3", got)
	}
}
