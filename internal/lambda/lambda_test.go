package lambda_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/lambda"
	"stoke.dev/stoke/internal/lambda/lambdasim"
	"stoke.dev/stoke/internal/lambda/payload"
	"stoke.dev/stoke/internal/runtime/runtimetest"
	"stoke.dev/stoke/internal/runtime/server"
	"stoke.dev/stoke/internal/testbin"
	"stoke.dev/stoke/internal/testdeps"
)

var stokeBin, rieBin string

// launcher is what these tests package as bootstrap: a script that runs
// the stoke-lambda-bootstrap built for the test (beside stokeBin, where a
// Runtime Server finds it). The sandboxes run on this machine, so the
// package need not carry the binary, and megabytes less per CreateFunction
// keep the tests fast under -race. The e2e tests' launchers run the stoke
// binary under the name bootstrap, its other way to serve.
var launcher, bootstrapBin string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		var cleanup func()
		var err error
		if stokeBin, cleanup, err = testbin.Stoke(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer cleanup()
		if rieBin, err = testdeps.Path("aws-lambda-rie"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if bootstrapBin, err = testbin.LambdaBootstrap(filepath.Dir(stokeBin)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		launcher = filepath.Join(filepath.Dir(stokeBin), "launcher")
		script := "#!/usr/bin/env bash\nexec " + bootstrapBin + " \"$@\"\n"
		if err := os.WriteFile(launcher, []byte(script), 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		// A variable of the server's own environment that no handler may
		// see (the contract suite checks).
		os.Setenv(runtimetest.ServerSecretEnv, "must-not-leak")
		return m.Run()
	}())
}

const accessKey = "AKIDSTOKETEST"

// env is a Lambda Runtime Server for runtime on a fresh simulator.
type env struct {
	sim *lambdasim.Simulator
	rs  *runtimetest.Server
}

func start(t testing.TB, runtime string, fixtures map[runtimetest.Fixture]runtimetest.Source, observe ...func(string, time.Duration)) env {
	t.Helper()
	sim := simulator(t)
	srv := newServer(t, sim, runtime, observe...)
	rs := runtimetest.StartServer(t, runtimetest.Harness{
		Runtime:  "lambda",
		Fixtures: func(f runtimetest.Fixture) runtimetest.Source { return fixtures[f] },
	}, func(c *server.Config) { serve(c, srv) })
	return env{sim: sim, rs: rs}
}

// simulator is a fresh simulator for the test, its configuration changed
// by opts.
func simulator(t testing.TB, opts ...func(*lambdasim.Config)) *lambdasim.Simulator {
	t.Helper()
	cfg := lambdasim.Config{RIE: rieBin, Dir: t.TempDir(), AccessKeyID: accessKey, Concurrency: 10}
	for _, o := range opts {
		o(&cfg)
	}
	sim, err := lambdasim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// What the sandboxes wrote (the RIE's lines, the bootstrap's log),
	// which a failure's error alone does not tell; registered before
	// Close, so run after it, when every sandbox has ended and its output
	// is all read.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the simulator's sandboxes:\n%s", sim.SandboxLogs())
		}
	})
	t.Cleanup(func() { sim.Close() })
	return sim
}

// newServer is a Lambda Runtime Server for the inner runtime on sim.
func newServer(t testing.TB, sim *lambdasim.Simulator, runtime string, observe ...func(string, time.Duration)) *lambda.Server {
	t.Helper()
	return newServerWith(t, sim, runtime, func(cfg *lambda.Config) {
		if len(observe) > 0 {
			cfg.Observe = observe[0]
		}
	})
}

// newServerWith is newServer with its configuration changed by configure.
func newServerWith(t testing.TB, sim *lambdasim.Simulator, runtime string, configure func(*lambda.Config)) *lambda.Server {
	t.Helper()
	client := sim.Client()
	cfg := lambda.Config{
		Runtime: runtime, Role: "arn:aws:iam::123456789012:role/stoke", Bootstrap: launcher, Relay: stokeBin,
		Client: client, StateDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler),
	}
	configure(&cfg)
	srv, err := lambda.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

// serve makes c serve srv, with room for cold starts on a loaded machine.
func serve(c *server.Config, srv *lambda.Server) {
	c.Adapter, c.Exec = srv, srv.Executor
	c.InitTimeout = 90 * time.Second
	c.DefaultInvokeTimeout = 60 * time.Second
}

func src(file, handler, text string) runtimetest.Source {
	return runtimetest.Source{Files: map[string]string{file: text}, Handler: handler}
}

var pythonFixtures = map[runtimetest.Fixture]runtimetest.Source{
	runtimetest.Echo: src("handler.py", "handler.handle",
		"calls = 0\n\ndef handle(event, context):\n    global calls\n    calls += 1\n    context.set_output('calls', str(calls))\n    return event\n"),
	runtimetest.Fail:            src("handler.py", "handler.handle", "def handle(event):\n    raise ValueError('boom: it broke')\n"),
	runtimetest.MissingFunction: src("handler.py", "handler.handle", "def other(event):\n    return event\n"),
}

func register(t *testing.T, e env, f runtimetest.Fixture, uid string) (*pb.FunctionRegistration, *pb.FunctionStatusResponse) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	req := e.rs.RegisterRequest(t, f, uid, 1)
	resp, err := e.rs.Functions.RegisterFunction(ctx, req)
	if err != nil {
		t.Fatalf("register %s: %v", f, err)
	}
	st, err := e.rs.Functions.FunctionStatus(ctx, &pb.FunctionStatusRequest{Registration: resp.GetRegistration()})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetRegistration(), st
}

func TestPythonFunctionOnLambda(t *testing.T) {
	e := start(t, "python", pythonFixtures)
	ctx := context.Background()
	reg, st := register(t, e, runtimetest.Echo, "uid-a")
	if st.GetState() != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
		t.Fatalf("state %v, fatal_error %q", st.GetState(), st.GetFatalError())
	}
	fns := e.sim.Functions()
	if len(fns) != 1 || !strings.HasPrefix(fns[0], lambda.DefaultNamePrefix) {
		t.Fatalf("functions on Lambda: %v", fns)
	}
	// Warm: the module's globals persist across invocations.
	for want := 1; want <= 3; want++ {
		resp, err := e.rs.Invoke(ctx, reg, `{"hello":"lambda"}`, 0)
		if err != nil {
			t.Fatal(err)
		}
		if string(resp.GetOutput()) != `{"hello":"lambda"}` || resp.GetOutputs()["calls"] != fmt.Sprint(want) {
			t.Fatalf("invocation %d = %s, outputs %v", want, resp.GetOutput(), resp.GetOutputs())
		}
	}

	// A second registration with the same digest reuses the function.
	reg2, st2 := register(t, e, runtimetest.Echo, "uid-b")
	if st2.GetState() != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
		t.Fatalf("second registration: %v %q", st2.GetState(), st2.GetFatalError())
	}
	if n := e.sim.CreateCalls(); n != 1 {
		t.Fatalf("%d CreateFunction calls for two registrations with one digest; want 1", n)
	}
	// The collector keeps a function whose Run lives and deletes one whose
	// Run is gone; the registration then finds it vanished (503), and the
	// core loads it again, which recreates it.
	client := e.sim.Client()
	discard := slog.New(slog.DiscardHandler)
	live := func(_ context.Context, uid string) (bool, error) { return uid == "uid-a", nil }
	if deleted, err := lambda.Collect(ctx, client, "", live, discard); err != nil || len(deleted) != 0 {
		t.Fatalf("Collect with the Run alive = %v, %v; want nothing deleted", deleted, err)
	}
	gone := func(context.Context, string) (bool, error) { return false, nil }
	if deleted, err := lambda.Collect(ctx, client, "", gone, discard); err != nil || len(deleted) != 1 {
		t.Fatalf("Collect with the Run gone = %v, %v; want its function deleted", deleted, err)
	}
	if _, err := e.rs.Invoke(ctx, reg2, `1`, 0); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("invoking a vanished function = %v; want FailedPrecondition", err)
	}
	deadline := time.Now().Add(120 * time.Second)
	for {
		_, err := e.rs.Invoke(ctx, reg2, `1`, 0)
		if err == nil {
			break
		}
		if status.Code(err) != codes.FailedPrecondition || time.Now().After(deadline) {
			t.Fatalf("invoking while the function is recreated = %v", err)
		}
		time.Sleep(100 * time.Millisecond) // the core reloads in the background; no event reaches the client
	}
	if n := e.sim.CreateCalls(); n != 2 {
		t.Fatalf("%d CreateFunction calls; want 2 (the first and the re-creation)", n)
	}

	// Unregistering one keeps the function for the other; the last deletes it.
	if _, err := e.rs.Functions.UnregisterFunction(ctx, &pb.UnregisterFunctionRequest{Registration: reg}); err != nil {
		t.Fatal(err)
	}
	if got := e.sim.Functions(); len(got) != 1 {
		t.Fatalf("functions after the first unregister: %v; want the shared one kept", got)
	}
	if _, err := e.rs.Invoke(ctx, reg2, `1`, 0); err != nil {
		t.Fatalf("invoking the remaining registration: %v", err)
	}
	if _, err := e.rs.Functions.UnregisterFunction(ctx, &pb.UnregisterFunctionRequest{Registration: reg2}); err != nil {
		t.Fatal(err)
	}
	if got := e.sim.Functions(); len(got) != 0 {
		t.Fatalf("functions after the last unregister: %v; want none", got)
	}
}

func TestHandlerErrorAndInitError(t *testing.T) {
	e := start(t, "python", pythonFixtures)
	reg, st := register(t, e, runtimetest.Fail, "uid-f")
	if st.GetState() != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
		t.Fatalf("state %v, fatal_error %q", st.GetState(), st.GetFatalError())
	}
	_, err := e.rs.Invoke(context.Background(), reg, `{}`, 0)
	s := status.Convert(err)
	if s.Code() != codes.Unknown || !strings.Contains(s.Message(), "ValueError") || !strings.Contains(s.Message(), "boom") {
		t.Fatalf("handler error = %v; want FUNCTION_ERROR with ValueError", err)
	}

	_, st = register(t, e, runtimetest.MissingFunction, "uid-m")
	if st.GetState() != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_FAILED ||
		!strings.Contains(st.GetFatalError(), "Runtime.InitError") || !strings.Contains(st.GetFatalError(), "handle") {
		t.Fatalf("missing handler: state %v, fatal_error %q; want FAILED with the init error", st.GetState(), st.GetFatalError())
	}
	// The failed registration's function is not left behind.
	if got := e.sim.Functions(); len(got) != 1 {
		t.Fatalf("functions: %v; want only the working one", got)
	}
}

func TestOversizedPackageIsRefusedBeforeAnyAWSCall(t *testing.T) {
	e := start(t, "python", pythonFixtures)
	req := e.rs.RegisterRequest(t, runtimetest.Echo, "uid-big", 1)
	// Past Lambda's unzipped limit: a sparse file, refused from its size
	// before anything is read or compressed.
	blob := filepath.Join(req.GetWorkingDir(), "blob.bin")
	if err := os.WriteFile(blob, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(blob, bounds.LambdaUnzipped+1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	resp, err := e.rs.Functions.RegisterFunction(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	st, err := e.rs.Functions.FunctionStatus(ctx, &pb.FunctionStatusRequest{Registration: resp.GetRegistration()})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetState() != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_FAILED || !strings.Contains(st.GetFatalError(), "would unzip to more than") {
		t.Fatalf("oversized package: state %v, fatal_error %q", st.GetState(), st.GetFatalError())
	}
	if n := e.sim.CreateCalls(); n != 0 {
		t.Fatalf("%d CreateFunction calls for an oversized package; want none", n)
	}
}

var bashTasks = map[runtimetest.Fixture]runtimetest.Source{}

func TestTasksOnLambda(t *testing.T) {
	e := start(t, "bash", bashTasks)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name, script string
		state        pb.ExecutionState
		code         int32
		stdout       string
		outputs      map[string]string
	}{
		{"ok", "echo hello \"$1\"\necho RESULT=done >> \"$STOKE_OUTPUTS\"\n", pb.ExecutionState_EXECUTION_STATE_SUCCEEDED, 0, "hello world\n", map[string]string{"RESULT": "done"}},
		{"fails", "echo out\nexit 3\n", pb.ExecutionState_EXECUTION_STATE_FAILED, 3, "out\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := e.rs.Dir(t, runtimetest.Source{Files: map[string]string{"task.sh": tc.script}})
			id := "task-" + tc.name
			if _, err := e.rs.Runtime.Execute(ctx, &pb.ExecuteRequest{Id: id, WorkingDir: dir, Entrypoint: "task.sh", Args: []string{"world"}}); err != nil {
				t.Fatal(err)
			}
			st, err := e.rs.Runtime.Wait(ctx, &pb.StatusRequest{Id: id})
			if err != nil {
				t.Fatal(err)
			}
			if st.GetState() != tc.state || st.GetExitCode() != tc.code || st.GetStdout() != tc.stdout {
				t.Fatalf("task = %v exit %d stdout %q stderr %q (%s)", st.GetState(), st.GetExitCode(), st.GetStdout(), st.GetStderr(), st.GetErrorMessage())
			}
			for k, v := range tc.outputs {
				if st.GetOutputs()[k] != v {
					t.Fatalf("outputs %v; want %s=%s", st.GetOutputs(), k, v)
				}
			}
		})
	}
	// Each task's function is deleted after its invocation has answered,
	// a moment after the task's end may have reached the client.
	if got, err := e.sim.AwaitFunctions(ctx, func(fns []string) bool { return len(fns) == 0 }); err != nil {
		t.Fatalf("functions after the tasks: %v; want none (%v)", got, err)
	}
}

// TestTaskTimeoutEndsTheTaskOnLambda: a task that outlives its timeout
// ends TIMED_OUT at Stoke's deadline (the core ends the relay), and the
// bootstrap, told the deadline in the event, kills the task's process
// group in the sandbox a moment later, long before the sleep's 60 s or
// Lambda's 15 minutes. The timeout leaves room for the function's set-up
// on a loaded machine: a relay ended before the invocation is sent ends
// the set-up too, and the task never runs.
func TestTaskTimeoutEndsTheTaskOnLambda(t *testing.T) {
	e := start(t, "bash", bashTasks)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	mark := fmt.Sprintf("TASK_MARK=%d", time.Now().UnixNano())
	k, v, _ := strings.Cut(mark, "=")
	dir := e.rs.Dir(t, runtimetest.Source{Files: map[string]string{"task.sh": "sleep 60 &\nwait\n"}})
	if _, err := e.rs.Runtime.Execute(ctx, &pb.ExecuteRequest{Id: "task-slow", WorkingDir: dir, Entrypoint: "task.sh",
		Env: map[string]string{k: v}, TimeoutSeconds: 10}); err != nil {
		t.Fatal(err)
	}
	// The sandbox's processes are this machine's: no event tells when the
	// task starts or ends there, so /proc is polled.
	poll := func(what string, done func([]int) bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !done(lambdasim.Processes("sleep", mark)) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 30 s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	poll("the task's sleep to start in the sandbox", func(p []int) bool { return len(p) == 1 })
	st, err := e.rs.Runtime.Wait(ctx, &pb.StatusRequest{Id: "task-slow"})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetState() != pb.ExecutionState_EXECUTION_STATE_TIMED_OUT {
		t.Fatalf("task = %v (%s); want TIMED_OUT", st.GetState(), st.GetErrorMessage())
	}
	// The bootstrap answered (the task's TIMED_OUT, which no one waits
	// for any more): the function's timeout did not have to kill the
	// sandbox.
	ended, err := e.sim.AwaitEnded(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ended[0].ErrorType != "" {
		t.Fatalf("the task's invocation ended with %s; want the bootstrap's answer", ended[0].ErrorType)
	}
	// Lambda's own bound is the task's, not its 15 minutes.
	if ended[0].Timeout != 14*time.Second {
		t.Fatalf("the task function's timeout is %s; want the task's 10 s plus 4 s", ended[0].Timeout)
	}
	poll("the task's sleep to be killed in the sandbox", func(p []int) bool { return len(p) == 0 })
}

// BenchmarkRegisterToReady registers a new function (new code each time)
// on the simulator until READY, and reports the median of the whole and of
// Stoke's own work in it: packaging the zip, against the AWS calls (whose
// time is mostly the simulator's and the RIE's cold start).
func BenchmarkRegisterToReady(b *testing.B) {
	var mu sync.Mutex
	steps := map[string][]time.Duration{}
	e := start(b, "python", pythonFixtures, func(step string, d time.Duration) {
		mu.Lock()
		steps[step] = append(steps[step], d)
		mu.Unlock()
	})
	ctx := context.Background()
	var total []time.Duration
	for i := range b.N {
		req := e.rs.RegisterRequest(b, runtimetest.Echo, fmt.Sprintf("uid-%d", i), 1)
		if err := os.WriteFile(filepath.Join(req.GetWorkingDir(), "n.txt"), []byte(fmt.Sprint(i)), 0o644); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		resp, err := e.rs.Functions.RegisterFunction(ctx, req)
		for err == nil && resp.GetState() == pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_REGISTERING {
			resp, err = e.rs.Functions.RegisterFunction(ctx, req)
		}
		if err != nil || resp.GetState() != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
			b.Fatalf("register: %v %v", resp.GetState(), err)
		}
		total = append(total, time.Since(start))
		if _, err := e.rs.Functions.UnregisterFunction(ctx, &pb.UnregisterFunctionRequest{Registration: resp.GetRegistration()}); err != nil {
			b.Fatal(err)
		}
	}
	p50 := func(d []time.Duration) float64 {
		if len(d) == 0 {
			return 0
		}
		d = slices.Clone(d)
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	b.ReportMetric(p50(total), "ready-p50-ms")
	mu.Lock()
	defer mu.Unlock()
	for _, s := range []string{"package", "create", "active", "ping"} {
		b.ReportMetric(p50(steps[s]), s+"-p50-ms")
	}
	b.ReportMetric(p50(steps["package"])/p50(total), "package-share")
}

// BenchmarkServerInvoke measures a warm invocation through the Lambda
// Runtime Server (gRPC → core → SDK → simulator → RIE → bootstrap →
// Python) and, interleaved, the same function invoked directly through the
// SDK: the difference of the medians is the server's own share, the part
// of BenchmarkLambdaInvoke (e2e) that is not the gateway's and runtimed's.
func BenchmarkServerInvoke(b *testing.B) {
	e := start(b, "python", map[runtimetest.Fixture]runtimetest.Source{
		runtimetest.Echo: src("handler.py", "handler.handle", "def handle(event):\n    return event\n")})
	ctx := context.Background()
	reg := e.rs.Register(b, runtimetest.Echo, "uid-bench")
	fns := e.sim.Functions()
	if len(fns) != 1 {
		b.Fatalf("functions %v", fns)
	}
	ev, _ := json.Marshal(payload.Request{Kind: payload.KindInvoke, Input: json.RawMessage(`{"hello":"world"}`)})
	b.ResetTimer()
	e.sim.BesideDirect(b, fns[0], ev, "server", func() {
		resp, err := e.rs.Invoke(ctx, reg, `{"hello":"world"}`, 0)
		if err != nil || string(resp.GetOutput()) != `{"hello":"world"}` {
			b.Fatalf("server: %v %v", resp, err)
		}
	})
}
