package runtimed_test

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/gitsource"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/pydeps"
	rt "stoke.dev/stoke/internal/runtime"
	"stoke.dev/stoke/internal/runtime/server"
	"stoke.dev/stoke/internal/runtimed"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/sqlite"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is one pod: a real Runtime Server on a Unix socket, a real SQLite
// store, and a runtimed fed by a watch on the store (the wiring's job).
type env struct {
	t    *testing.T
	runs store.Resource[*v1alpha1.Run]
	pod  podsource.Pod
	d    *runtimed.Daemon
	// stateDir is runtimed's Config.StateDir.
	stateDir string
}

func newEnv(t *testing.T, runtime string) *env {
	t.Helper()
	return newEnvWith(t, runtime, envOptions{})
}

// envOptions change what runtimed sees of the store and where it logs.
type envOptions struct {
	// runs wraps the store's Runs as runtimed sees them.
	runs func(store.Resource[*v1alpha1.Run]) store.Resource[*v1alpha1.Run]
	// log is runtimed's logger (default: warnings to stderr).
	log *slog.Logger
	// fed, when set, is called with each watch event once runtimed has
	// been handed it.
	fed func(store.Event[*v1alpha1.Run])
	// calls, when set, sees every unary call runtimed makes to the
	// Runtime Server, as a network between them would.
	calls grpc.UnaryClientInterceptor
	// git is the pod's git cache.
	git *gitsource.Cache
	// gitSecret is runtimed.Config.GitSecret (Kubernetes mode's rule).
	gitSecret *string
	// runningAfter is runtimed.Config.RunningAfter (Kubernetes mode's
	// deferred claim).
	runningAfter time.Duration
}

func newEnvWith(t *testing.T, runtime string, opts envOptions) *env {
	t.Helper()
	dir := t.TempDir()
	ws := filepath.Join(dir, "runs")
	sock := filepath.Join(dir, "rs.sock")
	ctx, cancel := context.WithCancel(context.Background())
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	listening := make(chan net.Addr, 1)
	srvErr := make(chan error, 1)
	go func() {
		srvErr <- server.Run(ctx, server.Config{Runtime: runtime, Listen: "unix:" + sock, WorkspaceRoot: ws,
			StateDir: filepath.Join(dir, "state"), Python: "python3", ShutdownGrace: time.Second, Logger: log,
			OnListen: func(a net.Addr) { listening <- a }})
	}()
	select {
	case <-listening:
	case err := <-srvErr:
		t.Fatal(err)
	}
	st, err := sqlite.Open(ctx, filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	dial := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if opts.calls != nil {
		dial = append(dial, grpc.WithUnaryInterceptor(opts.calls))
	}
	conn, err := grpc.NewClient("unix://"+sock, dial...)
	if err != nil {
		t.Fatal(err)
	}
	pod := podsource.Pod{Namespace: "default", Runtime: runtime, Name: runtime + "-abcde", UID: "pod-uid-1", Server: runtime, Slots: 8,
		Addr: "unix://" + sock, WorkspaceRoot: ws}
	runs, dlog := st.Runs(), log
	if opts.runs != nil {
		runs = opts.runs(runs)
	}
	if opts.log != nil {
		dlog = opts.log
	}
	stateDir := filepath.Join(dir, "runtimed-state")
	d := runtimed.New(runtimed.Config{Pod: pod, Runs: runs, Conn: conn, Logger: dlog, StatusPoll: 50 * time.Millisecond, Git: opts.git, GitSecret: opts.gitSecret,
		RunningAfter: opts.runningAfter, StateDir: stateDir})
	w, err := st.Runs().Watch(ctx, store.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dDone := make(chan struct{})
	go func() { defer close(dDone); _ = d.Run(ctx) }()
	feedDone := make(chan struct{})
	go func() {
		defer close(feedDone)
		for ev := range w.Events() {
			switch ev.Type {
			case store.Added, store.Modified:
				// As runtimed.Dispatch: each ignores what is not its.
				d.OnRun(ev.Object)
				d.OnPlaced(ev.Object)
			case store.Deleted:
				d.OnDelete(ev.Object)
			}
			if opts.fed != nil {
				opts.fed(ev)
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		w.Stop()
		<-feedDone
		<-dDone
		conn.Close()
		st.Close()
		if err := <-srvErr; err != nil {
			t.Errorf("runtime server: %v", err)
		}
	})
	return &env{t: t, runs: st.Runs(), pod: pod, d: d, stateDir: stateDir}
}

// submit creates the Run and assigns it to the pod, as the scheduler would.
func (e *env) submit(run *v1alpha1.Run) *v1alpha1.Run {
	e.t.Helper()
	ctx := context.Background()
	created, err := e.runs.Create(ctx, run)
	if err != nil {
		e.t.Fatal(err)
	}
	created.Status.Phase = v1alpha1.PhaseScheduled
	created.Status.Attempt = 1
	created.Status.AssignedPod, created.Status.AssignedPodUID = e.pod.Name, e.pod.UID
	updated, err := e.runs.UpdateStatus(ctx, created)
	if err != nil {
		e.t.Fatal(err)
	}
	return updated
}

// waitPhase polls the store until the Run reaches one of phases.
func (e *env) waitPhase(name string, phases ...v1alpha1.Phase) *v1alpha1.Run {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		run, err := e.runs.Get(context.Background(), "default", name)
		if err == nil {
			for _, p := range phases {
				if run.Status.Phase == p {
					return run
				}
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("run %s never reached %v: %+v %v", name, phases, run.Status, err)
		}
		time.Sleep(5 * time.Millisecond) // polling an observable state
	}
}

func taskRun(name, script string) *v1alpha1.Run {
	return &v1alpha1.Run{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1alpha1.RunSpec{Runtime: "bash",
			Mode:   v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Entrypoint: "main.sh", Args: []string{"a b", "$(c)"}}},
			Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "main.sh", Text: script}},
			Env:    []v1alpha1.EnvVar{{Name: "GREETING", Value: "hi"}},
		},
	}
}

func TestTaskSucceeds(t *testing.T) {
	e := newEnv(t, "bash")
	e.submit(taskRun("ok", `echo "$GREETING $1 $2"; echo "ARGS=$#" >> "$STOKE_OUTPUTS"`))
	run := e.waitPhase("ok", v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed)
	if run.Status.Phase != v1alpha1.PhaseSucceeded || run.Status.ExitCode == nil || *run.Status.ExitCode != 0 ||
		run.Status.Outputs["ARGS"] != "2" || run.Status.StartTime == nil || run.Status.CompletionTime == nil {
		t.Fatalf("status %+v", run.Status)
	}
	// The worker removes the working directory after recording the result.
	dir := filepath.Join(e.pod.WorkspaceRoot, string(run.UID))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(dir); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("working directory left behind")
		}
	}
}

func TestTaskFailsAndRetries(t *testing.T) {
	e := newEnv(t, "bash")
	run := taskRun("fails", "echo nope >&2; exit 3")
	e.submit(run)
	got := e.waitPhase("fails", v1alpha1.PhaseFailed)
	if got.Status.ExitCode == nil || *got.Status.ExitCode != 3 || got.Status.Reason != "NonZeroExit" || got.Status.Message == "" {
		t.Fatalf("status %+v", got.Status)
	}
	// With NonZeroExit retryable, the engine sends the Run back to Pending
	// as attempt 2, unassigned.
	retried := taskRun("retried", "exit 3")
	retried.Spec.RetryPolicy = &v1alpha1.RetryPolicy{MaxAttempts: 2, RetryableReasons: []string{"NonZeroExit"}}
	e.submit(retried)
	got = e.waitPhase("retried", v1alpha1.PhasePending)
	if got.Status.Attempt != 2 || got.Status.AssignedPodUID != "" {
		t.Fatalf("status %+v", got.Status)
	}
}

func TestTaskTimeoutAndCancel(t *testing.T) {
	e := newEnv(t, "bash")
	slow := taskRun("slow", "sleep 60")
	slow.Spec.Timeout = &metav1.Duration{Duration: time.Second}
	e.submit(slow)
	if got := e.waitPhase("slow", v1alpha1.PhaseTimeout, v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed); got.Status.Phase != v1alpha1.PhaseTimeout {
		t.Fatalf("status %+v", got.Status)
	}
	e.submit(taskRun("cancel-me", "sleep 60"))
	running := e.waitPhase("cancel-me", v1alpha1.PhaseRunning)
	running.Spec.CancelRequested = true
	if _, err := e.runs.Update(context.Background(), running); err != nil {
		t.Fatal(err)
	}
	if got := e.waitPhase("cancel-me", v1alpha1.PhaseCancelled, v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed); got.Status.Phase != v1alpha1.PhaseCancelled {
		t.Fatalf("status %+v", got.Status)
	}
}

func functionRun(name, text string, idle int64) *v1alpha1.Run {
	return &v1alpha1.Run{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1alpha1.RunSpec{Runtime: "bash",
			Mode:   v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "fn.handle", IdleTimeoutSeconds: idle}},
			Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "fn.sh", Text: text}},
		},
	}
}

func TestFunctionLifecycle(t *testing.T) {
	e := newEnv(t, "bash")
	created := e.submit(functionRun("fn", `handle() { printf '{"got":%s}' "$1"; }`, 0))
	ready := e.waitPhase("fn", v1alpha1.PhaseReady, v1alpha1.PhaseFailed)
	if ready.Status.Phase != v1alpha1.PhaseReady || ready.Status.Endpoint == "" {
		t.Fatalf("status %+v", ready.Status)
	}
	proxy := e.d.Proxy()
	ctx := context.Background()
	resp, err := proxy.InvokeFunction(ctx, &pb.InvokeFunctionRequest{
		Registration: &pb.FunctionRegistration{RunUid: string(created.UID)}, Input: []byte(`[1]`)})
	if err != nil || string(resp.GetOutput()) != `{"got":[1]}` || resp.GetRegistration().GetRegistrationId() != "" {
		t.Fatalf("invoke through the proxy hop: %v %v", resp, err)
	}
	_, err = proxy.InvokeFunction(ctx, &pb.InvokeFunctionRequest{Registration: &pb.FunctionRegistration{RunUid: "nobody"}, Input: []byte(`1`)})
	if errdefs.Code(err) != codes.NotFound {
		t.Fatalf("unknown run: %v", err)
	}
	_, err = proxy.InvokeFunction(ctx, &pb.InvokeFunctionRequest{Registration: &pb.FunctionRegistration{RunUid: string(created.UID), RegistrationId: "reg_x"}, Input: []byte(`1`)})
	if errdefs.Code(err) != codes.InvalidArgument {
		t.Fatalf("registration id at the proxy: %v", err)
	}
	// Cancel drains and unregisters; the finalizer goes.
	ready.Spec.CancelRequested = true
	if _, err := e.runs.Update(ctx, ready); err != nil {
		t.Fatal(err)
	}
	done := e.waitPhase("fn", v1alpha1.PhaseCancelled)
	for deadline := time.Now().Add(10 * time.Second); len(done.Finalizers) > 0 && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		done, _ = e.runs.Get(ctx, "default", "fn")
	}
	if len(done.Finalizers) != 0 {
		t.Fatalf("finalizers left: %v", done.Finalizers)
	}
	_, err = proxy.InvokeFunction(ctx, &pb.InvokeFunctionRequest{Registration: &pb.FunctionRegistration{RunUid: string(created.UID)}, Input: []byte(`1`)})
	if errdefs.Code(err) != codes.NotFound {
		t.Fatalf("invoke after cancel: %v", err)
	}
}

func TestFunctionIdleTimeoutAndRegistrationFailure(t *testing.T) {
	e := newEnv(t, "bash")
	e.submit(functionRun("idle", `handle() { :; }`, 1))
	got := e.waitPhase("idle", v1alpha1.PhaseTimeout)
	if got.Status.Reason != "IdleTimeout" {
		t.Fatalf("status %+v", got.Status)
	}
	bad := functionRun("bad", `other() { :; }`, 0)
	bad.Spec.RetryPolicy = &v1alpha1.RetryPolicy{MaxAttempts: 2}
	e.submit(bad)
	got = e.waitPhase("bad", v1alpha1.PhasePending, v1alpha1.PhaseFailed)
	if got.Status.Phase != v1alpha1.PhasePending || got.Status.Attempt != 2 || got.Status.Reason != "RegistrationFailed" {
		t.Fatalf("status %+v", got.Status)
	}
}

// A RegisterFunction whose answer comes after the call's deadline (the
// server answers REGISTERING a margin before it, which a loaded machine
// can outlast) leaves the registration loading: runtimed asks again with
// the same attempt, which the contract makes idempotent, and the Run
// becomes Ready at attempt 1. It used to fail the Run RegistrationFailed.
func TestRegisterAnsweredLateIsAskedAgain(t *testing.T) {
	var mu sync.Mutex
	registers := 0
	e := newEnvWith(t, "bash", envOptions{calls: func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if method != pb.FunctionRuntime_RegisterFunction_FullMethodName {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if registers++; registers == 1 && err == nil {
			// The server answered; the answer reached the caller late.
			return status.Error(codes.DeadlineExceeded, "context deadline exceeded")
		}
		return err
	}})
	e.submit(functionRun("late", `handle() { printf '"ok"'; }`, 0))
	got := e.waitPhase("late", v1alpha1.PhaseReady, v1alpha1.PhaseFailed, v1alpha1.PhasePending)
	mu.Lock()
	n := registers
	mu.Unlock()
	if got.Status.Phase != v1alpha1.PhaseReady || got.Status.Attempt != 1 || n != 2 {
		t.Fatalf("status %s / %s attempt %d (%s) after %d RegisterFunction calls; want Ready at attempt 1 after 2",
			got.Status.Phase, got.Status.Reason, got.Status.Attempt, got.Status.Message, n)
	}
}

func TestFunctionDelete(t *testing.T) {
	e := newEnv(t, "bash")
	e.submit(functionRun("del", `handle() { :; }`, 0))
	e.waitPhase("del", v1alpha1.PhaseReady)
	ctx := context.Background()
	if err := e.runs.Delete(ctx, "default", "del", store.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := e.runs.Get(ctx, "default", "del")
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("deleted function Run never went away")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A Runtime Server without FunctionRuntime answers Unimplemented: the
// function Run fails for good (IncompatibleRuntime), never retried and never
// emulated through Execute.
func TestFunctionOnOneShotOnlyServer(t *testing.T) {
	dir := t.TempDir()
	ws := filepath.Join(dir, "runs")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	adapter, err := server.NewAdapter(ctx, "bash", "", "", pydeps.Config{})
	if err != nil {
		t.Fatal(err)
	}
	workspace, err := rt.NewWorkspace(ws)
	if err != nil {
		t.Fatal(err)
	}
	tasks, err := rt.NewTasks(rt.TasksConfig{Adapter: adapter, Workspace: workspace, ScratchRoot: filepath.Join(dir, "scratch"), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer tasks.Close(time.Second)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := server.NewGRPC(log, server.Services{Runtime: tasks}) // no FunctionRuntime
	served := make(chan error, 1)
	go func() { served <- g.Serve(ctx, lis, time.Second, nil) }()
	defer func() { cancel(); <-served }()

	st, err := sqlite.Open(ctx, filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pod := podsource.Pod{Namespace: "default", Runtime: "oneshot", Name: "oneshot-abcde", UID: "pod-oneshot", Slots: 1, WorkspaceRoot: ws}
	d := runtimed.New(runtimed.Config{Pod: pod, Runs: st.Runs(), Conn: conn, Logger: log})
	dctx, dcancel := context.WithCancel(ctx)
	dDone := make(chan struct{})
	go func() { defer close(dDone); _ = d.Run(dctx) }()
	defer func() { dcancel(); <-dDone }()

	e := &env{t: t, runs: st.Runs(), pod: pod, d: d}
	fn := functionRun("fn", `handle() { :; }`, 0)
	fn.Spec.RetryPolicy = &v1alpha1.RetryPolicy{MaxAttempts: 5}
	d.OnRun(e.submit(fn))
	got := e.waitPhase("fn", v1alpha1.PhaseFailed, v1alpha1.PhasePending)
	if got.Status.Phase != v1alpha1.PhaseFailed || got.Status.Reason != "IncompatibleRuntime" || got.Status.Attempt != 1 {
		t.Fatalf("status %+v", got.Status)
	}
}
