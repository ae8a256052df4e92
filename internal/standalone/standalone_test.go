package standalone_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/standalone"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/testbin"
)

var stokeBin string

func TestMain(m *testing.M) {
	bin, cleanup, err := testbin.Stoke()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	stokeBin = bin
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { cleanup() }))
}

// plane is a running standalone control plane.
type plane struct {
	*standalone.Standalone
	dataDir string
}

func start(t testing.TB, runtimes ...*v1alpha1.Runtime) *plane {
	t.Helper()
	dataDir := t.TempDir()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithCancel(context.Background())
	s, err := standalone.New(ctx, standalone.Config{
		DataDir: dataDir, Logger: log, DefaultRuntimes: runtimes,
		PodCommand:     func(_ podsource.Pod, args []string) *exec.Cmd { return exec.Command(stokeBin, args...) },
		HealthInterval: 200 * time.Millisecond, StatusPoll: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("standalone: %v", err)
		}
	})
	p := &plane{Standalone: s, dataDir: dataDir}
	// Wait until every pool has all its pods.
	want := 0
	if runtimes == nil {
		runtimes = standalone.DefaultRuntimes()
	}
	for _, rt := range runtimes {
		want += int(rt.Spec.Replicas)
	}
	deadline := time.Now().Add(60 * time.Second)
	for len(s.Pods()) < want {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d pods ready", len(s.Pods()), want)
		}
		time.Sleep(10 * time.Millisecond) // polling an observable state
	}
	return p
}

func runtimeOf(name string, replicas, runs int32) *v1alpha1.Runtime {
	return &v1alpha1.Runtime{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1alpha1.RuntimeSpec{Server: name, Replicas: replicas, Runs: runs}}
}

// waitRun polls until the Run satisfies ok.
func (p *plane) waitRun(t testing.TB, name string, what string, ok func(*v1alpha1.Run) bool) *v1alpha1.Run {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		run, err := p.GetRun(context.Background(), "default", name)
		if err == nil && ok(run) {
			return run
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s never became %s: %+v (%v)", name, what, run.Status, err)
		}
		time.Sleep(5 * time.Millisecond) // polling an observable state
	}
}

func phaseIs(phases ...v1alpha1.Phase) func(*v1alpha1.Run) bool {
	return func(r *v1alpha1.Run) bool {
		for _, p := range phases {
			if r.Status.Phase == p {
				return true
			}
		}
		return false
	}
}

func task(name string, args ...string) *v1alpha1.Run {
	return &v1alpha1.Run{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: args}}}}
}

func pyFunction(name, text string) *v1alpha1.Run {
	return &v1alpha1.Run{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.RunSpec{Runtime: "python",
			Mode:   v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "handler.handle"}},
			Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "handler.py", Text: text}}}}
}

// killPod kills -9 the runtime-server process of the pod named.
func killPod(t testing.TB, podName string) {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(cmdline), "/pods/"+podName+"/") {
			continue
		}
		var pid int
		fmt.Sscan(e.Name(), &pid)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("no process for pod %s", podName)
}

func TestTaskAndFunction(t *testing.T) {
	p := start(t, runtimeOf("bash", 1, 4), runtimeOf("python", 1, 4))
	ctx := context.Background()
	if _, err := p.CreateRun(ctx, task("hello", "bash", "-c", `echo hi; echo ANSWER=42 >> "$STOKE_OUTPUTS"`)); err != nil {
		t.Fatal(err)
	}
	run := p.waitRun(t, "hello", "terminal", func(r *v1alpha1.Run) bool { return r.Status.Phase.Terminal() })
	if run.Status.Phase != v1alpha1.PhaseSucceeded || run.Status.Outputs["ANSWER"] != "42" || run.Status.Attempt != 1 {
		t.Fatalf("status %+v", run.Status)
	}
	created, err := p.CreateRun(ctx, pyFunction("fn", "def handle(event):\n    return {'echo': event}\n"))
	if err != nil {
		t.Fatal(err)
	}
	ready := p.waitRun(t, "fn", "Ready", phaseIs(v1alpha1.PhaseReady))
	proxy, err := p.FunctionProxy(ready)
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	resp, err := proxy.InvokeFunction(ctx, &pb.InvokeFunctionRequest{Registration: &pb.FunctionRegistration{RunUid: string(created.UID)}, Input: []byte(`[1,2]`)})
	if err != nil || string(resp.GetOutput()) != `{"echo":[1,2]}` {
		t.Fatalf("invoke: %v %v", resp, err)
	}
	if _, err := p.CancelRun(ctx, "default", "fn"); err != nil {
		t.Fatal(err)
	}
	p.waitRun(t, "fn", "Cancelled", phaseIs(v1alpha1.PhaseCancelled))
}

func TestRefusedRuns(t *testing.T) {
	p := start(t, runtimeOf("bash", 1, 2))
	ctx := context.Background()
	_, err := p.CreateRun(ctx, &v1alpha1.Run{ObjectMeta: metav1.ObjectMeta{Name: "nort"},
		Spec: v1alpha1.RunSpec{Runtime: "ruby", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"true"}}}}})
	if errdefs.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "spec.runtime") {
		t.Fatalf("unknown runtime: %v", err)
	}
	_, err = p.CreateRun(ctx, &v1alpha1.Run{ObjectMeta: metav1.ObjectMeta{Name: "both"},
		Spec: v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"true"}},
			Function: &v1alpha1.FunctionMode{Handler: "a.b"}}}})
	if errdefs.Code(err) != codes.InvalidArgument {
		t.Fatalf("two modes: %v", err)
	}
	runs, _, err := p.ListRuns(ctx, store.ListOptions{})
	if err != nil || len(runs) != 0 {
		t.Fatalf("refused runs were stored: %v %v", runs, err)
	}
	// A Runtime stored a moment ago, which the cache may not hold yet, is
	// found in the store: the create is accepted at once.
	rt := runtimeOf("ruby", 1, 1)
	rt.Spec.Server = "bash"
	if _, err := p.Store().Runtimes().Create(ctx, rt); err != nil {
		t.Fatal(err)
	}
	if _, err := p.CreateRun(ctx, &v1alpha1.Run{ObjectMeta: metav1.ObjectMeta{Name: "late"},
		Spec: v1alpha1.RunSpec{Runtime: "ruby", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"true"}}}}}); err != nil {
		t.Fatalf("run of a Runtime just stored: %v", err)
	}
}

// kill -9 of the runtime server under a Ready function: the Run recovers
// as attempt 2 on a live pod and serves again; calls in the gap fail fast.
func TestFunctionSurvivesPodKill(t *testing.T) {
	p := start(t, runtimeOf("python", 2, 4))
	ctx := context.Background()
	fn := pyFunction("survivor", "def handle(event):\n    return event\n")
	fn.Spec.RetryPolicy = &v1alpha1.RetryPolicy{MaxAttempts: 3, Backoff: &metav1.Duration{}}
	created, err := p.CreateRun(ctx, fn)
	if err != nil {
		t.Fatal(err)
	}
	ready := p.waitRun(t, "survivor", "Ready", phaseIs(v1alpha1.PhaseReady))
	proxy, err := p.FunctionProxy(ready)
	if err != nil {
		t.Fatal(err)
	}
	killPod(t, ready.Status.AssignedPod)
	// Calls during the gap answer quickly with a retryable code.
	for i := 0; i < 20; i++ {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		start := time.Now()
		_, err := proxy.InvokeFunction(cctx, &pb.InvokeFunctionRequest{Registration: &pb.FunctionRegistration{RunUid: string(created.UID)}, Input: []byte(`1`)})
		cancel()
		if err == nil {
			continue
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("a call in the gap took %s", d)
		}
		switch errdefs.Code(err) {
		case codes.Unavailable, codes.FailedPrecondition, codes.NotFound:
		default:
			t.Fatalf("a call in the gap: %v", err)
		}
	}
	again := p.waitRun(t, "survivor", "Ready as attempt 2", func(r *v1alpha1.Run) bool {
		return r.Status.Phase == v1alpha1.PhaseReady && r.Status.Attempt == 2
	})
	if again.Status.AssignedPodUID == ready.Status.AssignedPodUID {
		t.Fatal("recovered onto the dead pod")
	}
	proxy, err = p.FunctionProxy(again)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := proxy.InvokeFunction(ctx, &pb.InvokeFunctionRequest{Registration: &pb.FunctionRegistration{RunUid: string(created.UID)}, Input: []byte(`"back"`)})
	if err != nil || string(resp.GetOutput()) != `"back"` {
		t.Fatalf("after recovery: %v %v", resp, err)
	}
}

// A task on a pod that dies is retried or failed by its policy, never left
// Running.
func TestTaskOnDyingPod(t *testing.T) {
	p := start(t, runtimeOf("bash", 2, 4))
	ctx := context.Background()
	once := task("once", "sleep", "300")
	twice := task("twice", "sleep", "300")
	twice.Spec.RetryPolicy = &v1alpha1.RetryPolicy{MaxAttempts: 2, Backoff: &metav1.Duration{}}
	for _, r := range []*v1alpha1.Run{once, twice} {
		if _, err := p.CreateRun(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	a := p.waitRun(t, "once", "Running", phaseIs(v1alpha1.PhaseRunning))
	b := p.waitRun(t, "twice", "Running", phaseIs(v1alpha1.PhaseRunning))
	killed := map[string]bool{}
	for _, pod := range []string{a.Status.AssignedPod, b.Status.AssignedPod} {
		if !killed[pod] {
			killed[pod] = true
			killPod(t, pod)
		}
	}
	got := p.waitRun(t, "once", "Failed", phaseIs(v1alpha1.PhaseFailed))
	if got.Status.Reason != "PodGone" && got.Status.Reason != "ExecutionLost" {
		t.Fatalf("once: %+v", got.Status)
	}
	p.waitRun(t, "twice", "Running as attempt 2", func(r *v1alpha1.Run) bool {
		return r.Status.Phase == v1alpha1.PhaseRunning && r.Status.Attempt == 2
	})
	if _, err := p.CancelRun(ctx, "default", "twice"); err != nil {
		t.Fatal(err)
	}
	p.waitRun(t, "twice", "Cancelled", phaseIs(v1alpha1.PhaseCancelled))
}

// What the API shows — a Get, a watch event — never runs ahead of the
// cache the invoke path routes from: a client that sees a function Ready
// and invokes it at once finds it routable.
func TestReadsNeverGetAheadOfTheCache(t *testing.T) {
	p := start(t, runtimeOf("bash", 1, 8), runtimeOf("python", 1, 4))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	w, err := p.WatchRuns(ctx, store.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	rvOf := func(r *v1alpha1.Run) uint64 { n, _ := strconv.ParseUint(r.ResourceVersion, 10, 64); return n }
	behind := func(what string, r *v1alpha1.Run) {
		t.Helper()
		cached, ok := p.CachedRun(r.Namespace, r.Name)
		if !ok || rvOf(cached) < rvOf(r) {
			t.Errorf("%s shows %s at version %s; the cache has %v", what, r.Name, r.ResourceVersion, cached)
		}
	}
	fn, err := p.CreateRun(ctx, pyFunction("fn", "def handle(event):\n    return event\n"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		created, err := p.CreateRun(ctx, task(fmt.Sprintf("t%d", i), "true"))
		if err != nil {
			t.Fatal(err)
		}
		got, err := p.GetRun(ctx, "default", created.Name)
		if err != nil {
			t.Fatal(err)
		}
		behind("GetRun", got)
	}
	for ev := range w.Events() {
		if ev.Type == store.Error {
			t.Fatal(ev.Err)
		}
		if ev.Type == store.Deleted {
			continue
		}
		behind("the watch", ev.Object)
		if ev.Object.Name == fn.Name && ev.Object.Status.Phase == v1alpha1.PhaseReady {
			if _, err := p.Route("default", fn.Name, string(fn.UID)); err != nil {
				t.Fatalf("seen Ready on the watch, then not routable: %v", err)
			}
			return
		}
	}
	t.Fatal("the watch ended before the function was Ready")
}

// Before the Runs cache has synced (the API may already serve), an
// invocation is told to come back, never that its Run does not exist.
func TestRouteBeforeSyncIsUnavailable(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s, err := standalone.New(ctx, standalone.Config{DataDir: t.TempDir(),
		PodCommand: func(_ podsource.Pod, args []string) *exec.Cmd { return exec.Command(stokeBin, args...) }})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Route("default", "fn", "some-uid")
	if secs, ok := errdefs.RetryAfterSeconds(err); errdefs.Code(err) != codes.Unavailable || !ok || secs < 1 {
		t.Errorf("Route before sync: %v (Retry-After %d, %v), want Unavailable with a Retry-After", err, secs, ok)
	}
	cancel()
	if err := s.Run(ctx); err != nil {
		t.Error(err)
	}
}
