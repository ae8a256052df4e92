package runtimed_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
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
	"stoke.dev/stoke/internal/syncbuf"
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
	// after, if set, runs once a write is stored, before it returns to
	// runtimed (a watch may deliver the write to others first).
	after func(ctx context.Context, stored *v1alpha1.Run)
}

func newStatusWrites() *statusWrites { return &statusWrites{phases: map[string][]v1alpha1.Phase{}} }

func (s *statusWrites) wrap(r store.Resource[*v1alpha1.Run]) store.Resource[*v1alpha1.Run] {
	s.Resource = r
	return s
}

// UpdateStatus holds s.mu across the write and its record, so that a
// test that saw the write in the store (as it can while the write is in
// flight) and then asks of finds it recorded.
func (s *statusWrites) UpdateStatus(ctx context.Context, r *v1alpha1.Run) (*v1alpha1.Run, error) {
	if s.before != nil {
		s.before(ctx, r)
	}
	s.mu.Lock()
	u, err := s.Resource.UpdateStatus(ctx, r)
	if err == nil {
		s.phases[r.Name] = append(s.phases[r.Name], r.Status.Phase)
	}
	s.mu.Unlock()
	if err == nil {
		if s.after != nil {
			s.after(ctx, u)
		}
	}
	return u, err
}

func (s *statusWrites) of(name string) []v1alpha1.Phase {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]v1alpha1.Phase(nil), s.phases[name]...)
}

// forEachPlace runs test for a task of its own directory and for one in
// a shared workspace (a workflow step), whose claims are deferred alike
// and fenced differently (its directory; its mark).
func forEachPlace(t *testing.T, test func(t *testing.T, place func(*v1alpha1.Run) *v1alpha1.Run)) {
	t.Run("own", func(t *testing.T) { test(t, func(r *v1alpha1.Run) *v1alpha1.Run { return r }) })
	t.Run("shared", func(t *testing.T) {
		test(t, func(r *v1alpha1.Run) *v1alpha1.Run { return inWorkspace(r, "job-1", false) })
	})
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
	forEachPlace(t, testRefusedDeferredClaimCancelsTheTask)
}

func testRefusedDeferredClaimCancelsTheTask(t *testing.T, place func(*v1alpha1.Run) *v1alpha1.Run) {
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
	run := e.submit(place(taskRun("moved", "sleep 100000")))
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
	forEachPlace(t, testUnclaimedEndWriteConflicts)
}

func testUnclaimedEndWriteConflicts(t *testing.T, place func(*v1alpha1.Run) *v1alpha1.Run) {
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
	e.submit(place(taskRun("raced", "true")))
	got := e.waitPhase("raced", v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed)
	if got.Status.Phase != v1alpha1.PhaseSucceeded || got.Labels["touched"] != "yes" || got.Status.StartTime == nil {
		t.Fatalf("run %+v %+v", got.Labels, got.Status)
	}
	if got := w.of("raced"); len(got) != 1 || got[0] != v1alpha1.PhaseSucceeded {
		t.Fatalf("runtimed wrote %v; want one write, Succeeded", got)
	}
}

// A task in a shared workspace (a workflow step) defers its claim as one
// of its own directory does: one write, at its end. Its mark in
// runtimed's state directory exists from before it starts until its end
// is written, and is gone after; the workspace stays for the next step.
// Before, such a task was claimed first: Running, then its end.
func TestShortStepIsWrittenOnceAtItsEnd(t *testing.T) {
	w := newStatusWrites()
	var e *env
	markedAtEnd := make(chan bool, 1)
	w.before = func(_ context.Context, r *v1alpha1.Run) {
		_, err := os.Lstat(filepath.Join(e.stateDir, "taken", string(r.UID)))
		select {
		case markedAtEnd <- err == nil:
		default:
		}
	}
	e = newEnvWith(t, "bash", envOptions{runs: w.wrap, runningAfter: never})
	run := e.submit(inWorkspace(taskRun("step", `echo "ARGS=$#" >> "$STOKE_OUTPUTS"; echo kept > kept.txt`), "job-1", false))
	got := e.waitPhase("step", v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed)
	if st := got.Status; st.Phase != v1alpha1.PhaseSucceeded || st.Outputs["ARGS"] != "2" || st.StartTime == nil || st.CompletionTime == nil {
		t.Fatalf("status %+v", st)
	}
	if got := w.of("step"); len(got) != 1 || got[0] != v1alpha1.PhaseSucceeded {
		t.Fatalf("runtimed wrote %v; want one write, Succeeded", got)
	}
	if !<-markedAtEnd {
		t.Fatal("the step's mark was not there when its end was written")
	}
	mark := filepath.Join(e.stateDir, "taken", string(run.UID))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) { // polling an observable state
		if _, err := os.Lstat(mark); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the step's mark was left after its end")
		}
	}
	if _, err := os.Stat(filepath.Join(e.pod.WorkspaceRoot, "ws-job-1", "kept.txt")); err != nil {
		t.Fatalf("the workspace was not kept: %v", err)
	}
}

// A task annotated stoke.dev/claim-first (a workflow's artifact step,
// which the controller execs into once it is Running) is written Running
// before it starts, deferred claim or not.
func TestClaimFirstAnnotation(t *testing.T) {
	w := newStatusWrites()
	e := newEnvWith(t, "bash", envOptions{runs: w.wrap, runningAfter: never})
	run := inWorkspace(taskRun("hold", "true"), "job-1", false)
	run.Annotations = map[string]string{v1alpha1.AnnotationClaimFirst: "true"}
	e.submit(run)
	e.waitPhase("hold", v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed)
	if got := w.of("hold"); len(got) != 2 || got[0] != v1alpha1.PhaseRunning || got[1] != v1alpha1.PhaseSucceeded {
		t.Fatalf("runtimed wrote %v; want Running, Succeeded", got)
	}
}

// restartEnv is one pod whose runtimed can be stopped and started again
// while its Runtime Server (and what it runs) and its state directory
// live on, as when the runtimed container restarts.
type restartEnv struct {
	*env
	ctx  context.Context
	dir  string
	inf  *informer.Informer[*v1alpha1.Run]
	conn *grpc.ClientConn
	rt   pb.RuntimeClient
	log  *slog.Logger
}

func newRestartEnv(t *testing.T) *restartEnv {
	dir := t.TempDir()
	ws, sock := filepath.Join(dir, "runs"), filepath.Join(dir, "rs.sock")
	ctx, cancel := context.WithCancel(context.Background())
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
		cancel()
		t.Fatal(err)
	}
	st, err := sqlite.Open(ctx, filepath.Join(dir, "db"))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+sock, server.DialOptions()...)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	pod := podsource.Pod{Namespace: "default", Runtime: "bash", Name: "bash-abcde", UID: "pod-uid-1", Addr: "unix://" + sock, WorkspaceRoot: ws}
	stateDir := filepath.Join(dir, "runtimed-state")
	inf := informer.New(st.Runs(), informer.Options{AssignedPodUID: pod.UID})
	infDone := make(chan struct{})
	go func() {
		defer close(infDone)
		_ = inf.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-infDone
		conn.Close()
		st.Close()
		if err := <-srvErr; err != nil {
			t.Errorf("runtime server: %v", err)
		}
	})
	return &restartEnv{env: &env{t: t, runs: st.Runs(), pod: pod, stateDir: stateDir}, ctx: ctx, dir: dir, inf: inf, conn: conn,
		rt: pb.NewRuntimeClient(conn), log: log}
}

// start starts a runtimed of the pod (its claims deferred, never
// written) fed by the informer; stop stops it.
func (r *restartEnv) start() (d *runtimed.Started, stop func()) {
	d = runtimed.Start(r.ctx, runtimed.Config{Pod: r.pod, Runs: r.runs, Conn: r.conn, Logger: r.log, StatusPoll: 50 * time.Millisecond,
		RunningAfter: never, StateDir: r.stateDir})
	remove := r.inf.AddEventHandler(d.Handler())
	return d, func() {
		remove()
		d.Stop()
	}
}

// waitExecuting waits until the Runtime Server has the executions of
// runs' first attempts (its state has no event to await).
func (r *restartEnv) waitExecuting(runs ...*v1alpha1.Run) {
	r.t.Helper()
	for _, run := range runs {
		id := runlog.ExecutionID(string(run.UID), 1)
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if _, err := r.rt.Status(r.ctx, &pb.StatusRequest{Id: id}); err == nil {
				break
			}
			if time.Now().After(deadline) {
				r.t.Fatalf("execution %s never started", id)
			}
		}
	}
}

// forget has the Runtime Server cancel and forget run's execution, as if
// it had restarted.
func (r *restartEnv) forget(run *v1alpha1.Run) {
	r.t.Helper()
	id := runlog.ExecutionID(string(run.UID), 1)
	if _, err := r.rt.Cancel(r.ctx, &pb.CancelRequest{Id: id}); err != nil {
		r.t.Fatalf("cancel %s: %v", id, err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		_, err := r.rt.Forget(r.ctx, &pb.ForgetRequest{Id: id})
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("forget %s: %v", id, err)
		}
		time.Sleep(10 * time.Millisecond) // until the cancelled execution is terminal (no event for it)
	}
}

// mustBeScheduled checks that runtimed wrote nothing of the named Runs.
func (r *restartEnv) mustBeScheduled(names ...string) {
	r.t.Helper()
	for _, name := range names {
		if run, err := r.runs.Get(r.ctx, "default", name); err != nil || run.Status.Phase != v1alpha1.PhaseScheduled {
			r.t.Fatalf("%s before the restart: %+v %v; want Scheduled (its claim deferred)", name, run, err)
		}
	}
}

// waitingTask is a task that notes each start in starts, waits for the
// file gofile, and outputs DONE.
func waitingTask(name, starts, gofile string) *v1alpha1.Run {
	return taskRun(name, fmt.Sprintf(`echo started >> %q; while [ ! -e %q ]; do sleep 0.05; done; echo "DONE=$1" >> "$STOKE_OUTPUTS"`, starts, gofile))
}

// A runtimed that restarts while a task it started is still Scheduled (its
// claim deferred) never starts it again: the Run's directory on the pod
// says it was taken, so the new runtimed adopts it — a task the Runtime
// Server still runs is waited for and its result recorded; one it no
// longer knows fails as ExecutionLost (the retry engine decides), as a
// claimed one does.
func TestUnclaimedTaskIsAdoptedAfterRestart(t *testing.T) {
	e := newRestartEnv(t)
	_, stopFirst := e.start()
	gofile, starts := filepath.Join(e.dir, "go"), filepath.Join(e.dir, "starts")
	task := e.submit(waitingTask("task", starts, gofile))
	lost := e.submit(taskRun("lost", "sleep 100000"))
	// Both started, neither written Running.
	e.waitExecuting(task, lost)

	// The old runtimed goes; the Runtime Server forgets one execution
	// (as if it had restarted) before the new one comes.
	stopFirst()
	e.mustBeScheduled("task", "lost")
	e.forget(lost)

	second, stopSecond := e.start()
	defer stopSecond()
	second.Adopt(e.inf.List(nil))

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

// The same in a shared workspace, whose directory outlives its Runs and
// so says nothing of one: a step the previous runtimed started (its mark
// in runtimed's state directory) is adopted, never started again, or
// fails ExecutionLost when the Runtime Server forgot it; a step assigned
// while no runtimed ran, in a workspace an earlier step made, is started
// (no mark), not taken for started. The new runtimed's first list
// removes the mark of a Run that is no longer there.
func TestUnclaimedStepIsAdoptedAfterRestart(t *testing.T) {
	e := newRestartEnv(t)
	_, stopFirst := e.start()
	gofile, starts := filepath.Join(e.dir, "go"), filepath.Join(e.dir, "starts")
	e.submit(inWorkspace(taskRun("make", "echo made > made.txt"), "job-1", false))
	if got := e.waitPhase("make", v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed); got.Status.Phase != v1alpha1.PhaseSucceeded {
		t.Fatalf("make: %+v", got.Status)
	}
	step := e.submit(inWorkspace(waitingTask("step", starts, gofile), "job-1", false))
	lost := e.submit(inWorkspace(taskRun("lost", "sleep 100000"), "job-2", false))
	e.waitExecuting(step, lost)

	stopFirst()
	e.mustBeScheduled("step", "lost")
	e.forget(lost)
	next := e.submit(inWorkspace(taskRun("next", `read -r v < made.txt; echo "MADE=$v" >> "$STOKE_OUTPUTS"`), "job-1", false))
	stale := filepath.Join(e.stateDir, "taken", "0b6b2f6e-gone")
	if err := os.WriteFile(stale, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); len(e.inf.List(func(r *v1alpha1.Run) bool { return r.UID == next.UID })) == 0; time.Sleep(5 * time.Millisecond) { // polling an observable state
		if time.Now().After(deadline) {
			t.Fatal("the informer never saw next")
		}
	}

	second, stopSecond := e.start()
	defer stopSecond()
	second.Adopt(e.inf.List(nil))
	if _, err := os.Lstat(stale); !os.IsNotExist(err) {
		t.Errorf("the mark of a Run no longer there was kept: %v", err)
	}

	if err := os.WriteFile(gofile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	done := e.waitPhase("step", v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed)
	if done.Status.Phase != v1alpha1.PhaseSucceeded || done.Status.Outputs["DONE"] != "a b" || done.Status.StartTime == nil {
		t.Fatalf("adopted step: %+v", done.Status)
	}
	if b, err := os.ReadFile(starts); err != nil || string(b) != "started\n" {
		t.Fatalf("the step ran %q times: %v", b, err)
	}
	if got := e.waitPhase("lost", v1alpha1.PhaseFailed); got.Status.Reason != "ExecutionLost" {
		t.Fatalf("forgotten step: %+v", got.Status)
	}
	if got := e.waitPhase("next", v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed); got.Status.Phase != v1alpha1.PhaseSucceeded || got.Status.Outputs["MADE"] != "made" {
		t.Fatalf("a step assigned while runtimed was down, in a workspace that exists: %+v", got.Status)
	}
	for _, run := range []*v1alpha1.Run{step, lost, next} {
		mark := filepath.Join(e.stateDir, "taken", string(run.UID))
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) { // polling an observable state
			if _, err := os.Lstat(mark); os.IsNotExist(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the mark of %s was left after its end", run.Name)
			}
		}
	}
}

// A task's end is logged once its end write returned ("task ended"),
// with when each stage of its way on the pod ended, in order: runtimed
// took it, the Runtime Server had its execution, it exited, its end write
// began; the line's time is when the write returned.
// BenchmarkKube/WorkflowFanOut100 reads these lines.
func TestTaskEndedIsLoggedWithItsStages(t *testing.T) {
	var logs syncbuf.Buffer
	e := newEnvWith(t, "bash", envOptions{runningAfter: never,
		log: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	e.submit(inWorkspace(taskRun("step", "true"), "job-1", true))
	e.waitPhase("step", v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed)
	var line struct {
		Msg                                    string
		Run, State                             string
		Time, Took, Executing, Exited, Writing time.Time
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) { // polling an observable state
		found := false
		for l := range strings.SplitSeq(logs.String(), "\n") {
			if strings.Contains(l, `"task ended"`) {
				if err := json.Unmarshal([]byte(l), &line); err != nil {
					t.Fatal(err)
				}
				found = true
			}
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no task ended line in %s", logs.String())
		}
	}
	if line.Run != "default/step" || line.State != "EXECUTION_STATE_SUCCEEDED" || line.Took.IsZero() ||
		line.Executing.Before(line.Took) || line.Exited.Before(line.Executing) || line.Writing.Before(line.Exited) || line.Time.Before(line.Writing) {
		t.Fatalf("task ended: %+v", line)
	}
}
