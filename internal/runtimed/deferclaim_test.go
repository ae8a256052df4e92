package runtimed_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/runlog"
	"stoke.dev/stoke/internal/runtime/server"
	"stoke.dev/stoke/internal/runtimed"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/sqlite"
)

// never is a RunningAfter no test outlasts: the claim is never written.
const never = time.Hour

// statusWrites records the phases runtimed writes, in order, and runs
// before (if set) ahead of each write.
type statusWrites struct {
	store.Resource[*v1alpha1.Run]
	mu     sync.Mutex
	phases map[string][]v1alpha1.Phase // by Run name
	before func(ctx context.Context, r *v1alpha1.Run)
}

func newStatusWrites() *statusWrites { return &statusWrites{phases: map[string][]v1alpha1.Phase{}} }

func (s *statusWrites) wrap(r store.Resource[*v1alpha1.Run]) store.Resource[*v1alpha1.Run] {
	s.Resource = r
	return s
}

func (s *statusWrites) UpdateStatus(ctx context.Context, r *v1alpha1.Run) (*v1alpha1.Run, error) {
	if s.before != nil {
		s.before(ctx, r)
	}
	u, err := s.Resource.UpdateStatus(ctx, r)
	if err == nil {
		s.mu.Lock()
		s.phases[r.Name] = append(s.phases[r.Name], r.Status.Phase)
		s.mu.Unlock()
	}
	return u, err
}

func (s *statusWrites) of(name string) []v1alpha1.Phase {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]v1alpha1.Phase(nil), s.phases[name]...)
}

// With the claim deferred (Kubernetes mode), a task that ends before
// RunningAfter is written once, at its end: Scheduled → Succeeded, with its
// startTime, exit code and outputs. Before, every task was written twice
// (Running, then its end).
func TestShortTaskIsWrittenOnceAtItsEnd(t *testing.T) {
	w := newStatusWrites()
	e := newEnvWith(t, "bash", envOptions{runs: w.wrap, runningAfter: never})
	e.submit(taskRun("short", `echo "ARGS=$#" >> "$STOKE_OUTPUTS"`))
	run := e.waitPhase("short", v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed)
	st := run.Status
	if st.Phase != v1alpha1.PhaseSucceeded || st.ExitCode == nil || *st.ExitCode != 0 || st.Outputs["ARGS"] != "2" ||
		st.StartTime == nil || st.CompletionTime == nil || st.CompletionTime.Before(st.StartTime) {
		t.Fatalf("status %+v", st)
	}
	if got := w.of("short"); len(got) != 1 || got[0] != v1alpha1.PhaseSucceeded {
		t.Fatalf("runtimed wrote %v; want one write, Succeeded", got)
	}
}

// A task still running after RunningAfter is written Running (with the
// startTime of when runtimed took it), then its end, which keeps that
// startTime.
func TestLongTaskIsWrittenRunningAfterTheHold(t *testing.T) {
	w := newStatusWrites()
	e := newEnvWith(t, "bash", envOptions{runs: w.wrap, runningAfter: time.Millisecond})
	gofile := filepath.Join(t.TempDir(), "go")
	e.submit(taskRun("long", fmt.Sprintf(`while [ ! -e %q ]; do sleep 0.01; done`, gofile)))
	running := e.waitPhase("long", v1alpha1.PhaseRunning)
	if running.Status.StartTime == nil {
		t.Fatalf("Running without a startTime: %+v", running.Status)
	}
	if err := os.WriteFile(gofile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	done := e.waitPhase("long", v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed)
	if done.Status.Phase != v1alpha1.PhaseSucceeded || !done.Status.StartTime.Equal(running.Status.StartTime) {
		t.Fatalf("status %+v; want Succeeded with Running's startTime %v", done.Status, running.Status.StartTime)
	}
	if got := w.of("long"); len(got) != 2 || got[0] != v1alpha1.PhaseRunning || got[1] != v1alpha1.PhaseSucceeded {
		t.Fatalf("runtimed wrote %v; want Running, Succeeded", got)
	}
}

// A deferred claim refused because the Run moved on while its task ran
// (here reassigned to another pod, as after this pod was taken for lost)
// cancels the execution here and writes nothing: the Run is not this
// pod's to run any more.
func TestRefusedDeferredClaimCancelsTheTask(t *testing.T) {
	w := newStatusWrites()
	var once sync.Once
	w.before = func(ctx context.Context, r *v1alpha1.Run) {
		if r.Status.Phase != v1alpha1.PhaseRunning {
			return
		}
		once.Do(func() {
			cur, err := w.Resource.Get(ctx, r.Namespace, r.Name)
			if err != nil {
				t.Errorf("read %s: %v", r.Name, err)
				return
			}
			cur.Status.AssignedPod, cur.Status.AssignedPodUID = "bash-other", "pod-uid-2"
			if _, err := w.Resource.UpdateStatus(ctx, cur); err != nil {
				t.Errorf("reassign %s: %v", r.Name, err)
			}
		})
	}
	calls := make(chan string, 16)
	e := newEnvWith(t, "bash", envOptions{runs: w.wrap, runningAfter: time.Millisecond,
		calls: func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			err := invoker(ctx, method, req, reply, cc, opts...)
			if method == pb.Runtime_Cancel_FullMethodName {
				calls <- req.(*pb.CancelRequest).GetId()
			}
			return err
		}})
	run := e.submit(taskRun("moved", "sleep 100000"))
	select {
	case id := <-calls:
		if want := runlog.ExecutionID(string(run.UID), 1); id != want {
			t.Fatalf("cancelled %s, want %s", id, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the task of a Run that moved on was not cancelled")
	}
	got, err := e.runs.Get(context.Background(), "default", "moved")
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != v1alpha1.PhaseScheduled || got.Status.AssignedPodUID != "pod-uid-2" {
		t.Fatalf("phase %s on %s; want Scheduled on pod-uid-2 as the other writer left it", got.Status.Phase, got.Status.AssignedPodUID)
	}
	if got := w.of("moved"); len(got) != 0 {
		t.Fatalf("runtimed wrote %v; want nothing", got)
	}
}

// The end write of an unclaimed task that conflicts (another writer
// changed the Run meanwhile: here its labels) is read again and made on
// the fresh copy: Succeeded, once.
func TestUnclaimedEndWriteConflicts(t *testing.T) {
	w := newStatusWrites()
	var once sync.Once
	w.before = func(ctx context.Context, r *v1alpha1.Run) {
		once.Do(func() {
			cur, err := w.Resource.Get(ctx, r.Namespace, r.Name)
			if err != nil {
				t.Errorf("read %s: %v", r.Name, err)
				return
			}
			cur.Labels = map[string]string{"touched": "yes"}
			if _, err := w.Resource.Update(ctx, cur); err != nil {
				t.Errorf("label %s: %v", r.Name, err)
			}
		})
	}
	e := newEnvWith(t, "bash", envOptions{runs: w.wrap, runningAfter: never})
	e.submit(taskRun("raced", "true"))
	got := e.waitPhase("raced", v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed)
	if got.Status.Phase != v1alpha1.PhaseSucceeded || got.Labels["touched"] != "yes" || got.Status.StartTime == nil {
		t.Fatalf("run %+v %+v", got.Labels, got.Status)
	}
	if got := w.of("raced"); len(got) != 1 || got[0] != v1alpha1.PhaseSucceeded {
		t.Fatalf("runtimed wrote %v; want one write, Succeeded", got)
	}
}

// A runtimed that restarts while a task it started is still Scheduled (its
// claim deferred) never starts it again: the Run's directory on the pod
// says it was taken, so the new runtimed adopts it — a task the Runtime
// Server still runs is waited for and its result recorded; one it no
// longer knows fails as ExecutionLost (the retry engine decides), as a
// claimed one does.
func TestUnclaimedTaskIsAdoptedAfterRestart(t *testing.T) {
	dir := t.TempDir()
	ws, sock := filepath.Join(dir, "runs"), filepath.Join(dir, "rs.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	listening := make(chan net.Addr, 1)
	srvErr := make(chan error, 1)
	go func() {
		srvErr <- server.Run(ctx, server.Config{Runtime: "bash", Listen: "unix:" + sock, WorkspaceRoot: ws,
			StateDir: filepath.Join(dir, "state"), ShutdownGrace: time.Second, Logger: log,
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
	defer st.Close()
	conn, err := grpc.NewClient("unix://"+sock, server.DialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pod := podsource.Pod{Namespace: "default", Runtime: "bash", Name: "bash-abcde", UID: "pod-uid-1", Addr: "unix://" + sock, WorkspaceRoot: ws}
	e := &env{t: t, runs: st.Runs(), pod: pod}
	inf := informer.New(st.Runs(), informer.Options{AssignedPodUID: pod.UID})
	infDone := make(chan struct{})
	go func() {
		defer close(infDone)
		_ = inf.Run(ctx)
	}()
	defer func() {
		cancel()
		<-infDone
		if err := <-srvErr; err != nil {
			t.Errorf("runtime server: %v", err)
		}
	}()
	start := func() (*runtimed.Started, func()) {
		d := runtimed.Start(ctx, runtimed.Config{Pod: pod, Runs: st.Runs(), Conn: conn, Logger: log, StatusPoll: 50 * time.Millisecond,
			RunningAfter: never})
		return d, inf.AddEventHandler(d.Handler())
	}

	first, removeFirst := start()
	gofile, starts := filepath.Join(dir, "go"), filepath.Join(dir, "starts")
	task := e.submit(taskRun("task", fmt.Sprintf(`echo started >> %q; while [ ! -e %q ]; do sleep 0.05; done; echo "DONE=$1" >> "$STOKE_OUTPUTS"`, starts, gofile)))
	lost := e.submit(taskRun("lost", "sleep 100000"))
	// Both started, neither written Running: wait until the Runtime
	// Server has both (its state has no event to await).
	rt := pb.NewRuntimeClient(conn)
	taskID, lostID := runlog.ExecutionID(string(task.UID), 1), runlog.ExecutionID(string(lost.UID), 1)
	for _, id := range []string{taskID, lostID} {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if _, err := rt.Status(ctx, &pb.StatusRequest{Id: id}); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("execution %s never started", id)
			}
		}
	}

	// The old runtimed goes; the Runtime Server forgets one execution
	// (as if it had restarted) before the new one comes.
	removeFirst()
	first.Stop()
	for _, name := range []string{"task", "lost"} {
		if r, err := st.Runs().Get(ctx, "default", name); err != nil || r.Status.Phase != v1alpha1.PhaseScheduled {
			t.Fatalf("%s before the restart: %+v %v; want Scheduled (its claim deferred)", name, r, err)
		}
	}
	if _, err := rt.Cancel(ctx, &pb.CancelRequest{Id: lostID}); err != nil {
		t.Fatalf("cancel %s: %v", lostID, err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		_, err := rt.Forget(ctx, &pb.ForgetRequest{Id: lostID})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("forget %s: %v", lostID, err)
		}
		time.Sleep(10 * time.Millisecond) // until the cancelled execution is terminal (no event for it)
	}

	second, removeSecond := start()
	defer second.Stop()
	defer removeSecond()
	second.Adopt(inf.List(nil))

	if err := os.WriteFile(gofile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	done := e.waitPhase("task", v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed)
	if done.Status.Phase != v1alpha1.PhaseSucceeded || done.Status.Outputs["DONE"] != "a b" || done.Status.StartTime == nil {
		t.Fatalf("adopted task: %+v", done.Status)
	}
	if b, err := os.ReadFile(starts); err != nil || string(b) != "started\n" {
		t.Fatalf("the task ran %q times: %v", b, err)
	}
	if got := e.waitPhase("lost", v1alpha1.PhaseFailed); got.Status.Reason != "ExecutionLost" {
		t.Fatalf("forgotten task: %+v", got.Status)
	}
}
