package server_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/runtime/runtimetest"
	"stoke.dev/stoke/internal/runtime/server"
)

// The figures issue 2 asks for, measured at the gRPC boundary: a real
// client on loopback → runtime server → warm handler → client. Run with
// `make bench`.

func harness(runtime string) runtimetest.Harness {
	if runtime == "python" {
		return runtimetest.Python(runtime)
	}
	return runtimetest.Bash(runtime)
}

// latencies records per-call durations and reports percentiles.
type latencies []time.Duration

func (l latencies) report(b *testing.B) {
	if len(l) == 0 {
		return
	}
	slices.Sort(l)
	pct := func(p float64) float64 {
		return float64(l[int(float64(len(l)-1)*p)].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(0, "ns/op") // the percentiles are the figures
}

func benchInvoke(b *testing.B, runtime string, pace time.Duration) {
	s := runtimetest.StartServer(b, harness(runtime), nil)
	reg := s.Register(b, runtimetest.Echo, "bench")
	ctx := context.Background()
	req := &pb.InvokeFunctionRequest{Registration: reg, Input: []byte(`{"command":"status"}`), ContentType: "application/json"}
	measure(b, pace, func() {
		if _, err := s.Functions.InvokeFunction(ctx, req); err != nil {
			b.Fatal(err)
		}
	})
}

// measure calls call 50 times to warm the connection and the runtime, then
// b.N times, one every pace if it is set, and reports the percentiles.
func measure(b *testing.B, pace time.Duration, call func()) {
	for range 50 {
		call()
	}
	lat := make(latencies, 0, b.N)
	b.ResetTimer()
	next := time.Now()
	for range b.N {
		if pace > 0 {
			next = next.Add(pace)
			time.Sleep(time.Until(next)) // pacing the load, not synchronising
		}
		start := time.Now()
		call()
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	lat.report(b)
}

func BenchmarkInvokeBash(b *testing.B)        { benchInvoke(b, "bash", 0) }
func BenchmarkInvokeBashPaced(b *testing.B)   { benchInvoke(b, "bash", 10*time.Millisecond) }
func BenchmarkInvokePython(b *testing.B)      { benchInvoke(b, "python", 0) }
func BenchmarkInvokePythonPaced(b *testing.B) { benchInvoke(b, "python", 10*time.Millisecond) }

// forkPerCallFiles returns the bash the baselines start and a directory
// holding their f.sh.
func forkPerCallFiles(b *testing.B) (bash, dir string) {
	dir = b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f.sh"), []byte(`handle() { printf '%s' "$1"; }`), 0o644); err != nil {
		b.Fatal(err)
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		b.Fatal(err)
	}
	return bash, dir
}

// BenchmarkForkPerCallBash is the baseline the warm Bash runtime must beat
// by 4×: a new bash per call that sources the file and runs the function.
func BenchmarkForkPerCallBash(b *testing.B) {
	bash, dir := forkPerCallFiles(b)
	lat := make(latencies, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		cmd := exec.Command(bash, "-c", `source f.sh; handle "$1"`, "bash", `{"command":"status"}`)
		cmd.Dir = dir
		if out, err := cmd.Output(); err != nil || string(out) != `{"command":"status"}` {
			b.Fatalf("%q %v", out, err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	lat.report(b)
}

// benchPython lets a run name the interpreter, e.g. a clean venv without
// this machine's site-packages start-up hooks: STOKE_BENCH_PYTHON=….
func benchPython(cfg *server.Config) {
	if p := os.Getenv("STOKE_BENCH_PYTHON"); p != "" {
		cfg.Python = p
	}
}

func benchRegister(b *testing.B, runtime string) {
	s := runtimetest.StartServer(b, harness(runtime), benchPython)
	ctx := context.Background()
	lat := make(latencies, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		req := s.RegisterRequest(b, runtimetest.Echo, "bench-register-"+strconv.Itoa(i), 1)
		b.StartTimer()
		start := time.Now()
		resp, err := s.Functions.RegisterFunction(ctx, req)
		if err != nil || resp.GetState() != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
			b.Fatalf("%v %v", resp, err)
		}
		lat = append(lat, time.Since(start))
		b.StopTimer()
		if _, err := s.Functions.UnregisterFunction(ctx, &pb.UnregisterFunctionRequest{Registration: resp.GetRegistration(), CancelInFlight: true}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	lat.report(b)
}

func BenchmarkRegisterBash(b *testing.B)   { benchRegister(b, "bash") }
func BenchmarkRegisterPython(b *testing.B) { benchRegister(b, "python") }

// BenchmarkIdleRegistrations registers STOKE_BENCH_REGISTRATIONS (default
// 500) READY functions on one server and reports the proportional set size
// (PSS, so shared pages are not counted twice) of all their processes per
// registration. Run it with -benchtime=1x.
func benchIdle(b *testing.B, runtime string) {
	n := 500
	if v, err := strconv.Atoi(os.Getenv("STOKE_BENCH_REGISTRATIONS")); err == nil && v > 0 {
		n = v
	}
	for i := 0; i < b.N; i++ {
		s := runtimetest.StartServer(b, harness(runtime), nil)
		before := descendantsPSS(b)
		ctx := context.Background()
		for j := 0; j < n; j++ {
			resp, err := s.Functions.RegisterFunction(ctx, s.RegisterRequest(b, runtimetest.Echo, fmt.Sprintf("idle-%d-%d", i, j), 1))
			if err != nil || resp.GetState() != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
				b.Fatalf("registration %d: %v %v", j, resp, err)
			}
		}
		after := descendantsPSS(b)
		b.ReportMetric(float64(after-before)/float64(n)/(1<<20), "MiB/registration")
		b.ReportMetric(float64(n), "registrations")
	}
	b.ReportMetric(0, "ns/op")
}

func BenchmarkIdleRegistrationsBash(b *testing.B)   { benchIdle(b, "bash") }
func BenchmarkIdleRegistrationsPython(b *testing.B) { benchIdle(b, "python") }

// descendantsPSS sums the PSS of every descendant of this process.
func descendantsPSS(b *testing.B) int64 {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		b.Fatal(err)
	}
	parent := map[int]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// The command name may contain spaces: fields start after ')'.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) > 1 {
			ppid, _ := strconv.Atoi(fields[1])
			parent[pid] = ppid
		}
	}
	self := os.Getpid()
	var total int64
	for pid := range parent {
		p := pid
		for p != 0 && p != self {
			p = parent[p]
		}
		if p != self || pid == self {
			continue
		}
		rollup, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(rollup), "\n") {
			if strings.HasPrefix(line, "Pss:") {
				kb, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
				total += kb << 10
			}
		}
	}
	return total
}

// forkPerCall is the naive Runtime Server the warm runtime is measured
// against at the gRPC boundary: every InvokeFunction starts a new bash that
// sources the file and runs the function.
type forkPerCall struct {
	pb.UnimplementedFunctionRuntimeServer
	bash, dir string
}

func (f *forkPerCall) InvokeFunction(ctx context.Context, req *pb.InvokeFunctionRequest) (*pb.InvokeFunctionResponse, error) {
	cmd := exec.CommandContext(ctx, f.bash, "-c", `source f.sh; handle "$1"`, "bash", string(req.GetInput()))
	cmd.Dir = f.dir
	out, err := cmd.Output()
	if err != nil {
		return nil, err
	}
	return &pb.InvokeFunctionResponse{Output: out, ContentType: "application/json"}, nil
}

// BenchmarkForkPerCallBashGRPC is that baseline through a real gRPC server
// on loopback, as the warm figures are measured.
func BenchmarkForkPerCallBashGRPC(b *testing.B) {
	bash, dir := forkPerCallFiles(b)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	pb.RegisterFunctionRuntimeServer(srv, &forkPerCall{bash: bash, dir: dir})
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := pb.NewFunctionRuntimeClient(conn)
	ctx := context.Background()
	req := &pb.InvokeFunctionRequest{Input: []byte(`{"command":"status"}`), ContentType: "application/json"}
	measure(b, 0, func() {
		resp, err := client.InvokeFunction(ctx, req)
		if err != nil || string(resp.GetOutput()) != `{"command":"status"}` {
			b.Fatalf("%v %v", resp, err)
		}
	})
}
