package metricsrpc

import (
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	metricsv1 "stoke.dev/stoke/api/metrics/v1"
)

// serve runs a real gRPC server with the metrics service over reg on a
// Unix socket, and returns a connection to it.
func serve(t *testing.T, reg *prometheus.Registry) *grpc.ClientConn {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "m.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	metricsv1.RegisterMetricsServiceServer(s, NewServer(reg))
	done := make(chan error, 1)
	go func() { done <- s.Serve(lis) }()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		s.Stop()
		<-done
	})
	return conn
}

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// Two servers' families merge into one per name, each series labelled
// with its target; a target that cannot be scraped is up 0 and leaves the
// rest alone.
func TestGatherer(t *testing.T) {
	var conns []*grpc.ClientConn
	for i, n := range []float64{3, 5} {
		reg := prometheus.NewRegistry()
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "calls_total", Help: "Calls."}, []string{"result"})
		reg.MustRegister(c)
		c.WithLabelValues("ok").Add(n)
		if i == 1 {
			c.WithLabelValues("error").Add(1)
		}
		conns = append(conns, serve(t, reg))
	}
	dead, err := grpc.NewClient("unix://"+filepath.Join(t.TempDir(), "none.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	g := NewGatherer(func() []Target {
		return []Target{
			{Conn: conns[0], Labels: map[string]string{"pod": "a"}},
			{Conn: conns[1], Labels: map[string]string{"pod": "b"}},
			{Conn: dead, Labels: map[string]string{"pod": "gone"}},
		}
	}, 2*time.Second, nil)
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]float64{} // family → "pod/result" → value
	for _, mf := range mfs {
		got[mf.GetName()] = map[string]float64{}
		for _, m := range mf.GetMetric() {
			l := labelsOf(m)
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			got[mf.GetName()][l["pod"]+"/"+l["result"]] = v
		}
	}
	want := map[string]map[string]float64{
		"calls_total":             {"a/ok": 3, "b/ok": 5, "b/error": 1},
		"stoke_runtime_server_up": {"a/": 1, "b/": 1, "gone/": 0},
	}
	if len(got) != len(want) {
		t.Fatalf("families %v, want %v", got, want)
	}
	for name, series := range want {
		for k, v := range series {
			if gv, ok := got[name][k]; !ok || gv != v {
				t.Errorf("%s %s = %v (present %v), want %v", name, k, gv, ok, v)
			}
		}
		if len(got[name]) != len(series) {
			t.Errorf("%s has %v, want %v", name, got[name], series)
		}
	}
	// What the gateway serves: the families pass prometheus' own checks
	// when gathered beside another registry.
	if _, err := (prometheus.Gatherers{prometheus.NewRegistry(), g}).Gather(); err != nil {
		t.Fatalf("merged gather: %v", err)
	}
}
