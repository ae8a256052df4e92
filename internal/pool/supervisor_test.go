package pool

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"stoke.dev/stoke/internal/syncbuf"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testingclock "k8s.io/utils/clock/testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/shm"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/sqlite"
	"stoke.dev/stoke/internal/testbin"
)

// stokeBin is the stoke binary the pods run, built once by TestMain.
var stokeBin string

func TestMain(m *testing.M) {
	if data := os.Getenv(helperDataEnv); data != "" {
		os.Exit(helperSupervisor(data, os.Getenv(helperBinEnv)))
	}
	bin, cleanup, err := testbin.Stoke()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	stokeBin = bin
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { cleanup() }))
}

// eventTimeout bounds every wait for an event; it is a failure bound, not
// a synchronisation.
const eventTimeout = 30 * time.Second

type harness struct {
	t       *testing.T
	data    string
	st      *sqlite.Store
	sup     *Supervisor
	events  <-chan podsource.Event
	unsub   func()
	logs    *syncbuf.Buffer
	cancel  context.CancelFunc
	runErr  chan error
	stopped bool
}

// newHarness opens a store in a temporary data directory, creates the given
// Runtimes, and starts a subscribed supervisor on it.
func newHarness(t *testing.T, mutate func(*Config), runtimes ...*v1alpha1.Runtime) *harness {
	t.Helper()
	data := t.TempDir()
	st, err := sqlite.Open(t.Context(), data)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	h := &harness{t: t, data: data, st: st, logs: &syncbuf.Buffer{}, runErr: make(chan error, 1)}
	for _, rt := range runtimes {
		h.create(rt)
	}
	cfg := Config{
		Store:          st,
		DataDir:        data,
		Command:        func(_ podsource.Pod, args []string) *exec.Cmd { return exec.Command(stokeBin, args...) },
		Logger:         slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		HealthInterval: 100 * time.Millisecond,
		CheckTimeout:   500 * time.Millisecond,
		UnhealthyAfter: 3,
		StartTimeout:   20 * time.Second,
		ShutdownGrace:  2 * time.Second,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	h.sup, err = NewSupervisor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var snapshot []podsource.Pod
	h.events, snapshot, h.unsub = h.sup.Subscribe()
	if len(snapshot) != 0 {
		t.Fatalf("snapshot before Run: %v", snapshot)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.runErr <- h.sup.Run(ctx) }()
	t.Cleanup(func() {
		h.stop()
		if t.Failed() {
			t.Logf("supervisor log:\n%s", h.logs.String())
		}
	})
	return h
}

// stop ends Run, drains the events to the closed channel and returns the
// PodGone events seen on the way.
func (h *harness) stop() []podsource.Event {
	if h.stopped {
		return nil
	}
	h.stopped = true
	h.cancel()
	var gone []podsource.Event
	timeout := time.After(eventTimeout)
	for {
		select {
		case ev, ok := <-h.events:
			if !ok {
				h.unsub()
				select {
				case err := <-h.runErr:
					if err != nil {
						h.t.Errorf("Run: %v", err)
					}
				case <-timeout:
					h.t.Fatal("Run did not return")
				}
				return gone
			}
			if ev.Type == podsource.PodGone {
				gone = append(gone, ev)
			}
		case <-timeout:
			h.t.Fatal("events did not end after shutdown")
		}
	}
}

func (h *harness) create(rt *v1alpha1.Runtime) {
	h.t.Helper()
	if _, err := h.st.Runtimes().Create(h.t.Context(), rt); err != nil {
		h.t.Fatal(err)
	}
}

// update changes a Runtime's spec, retrying on conflicts with the
// supervisor's status writes.
func (h *harness) update(name string, change func(*v1alpha1.RuntimeSpec)) {
	h.t.Helper()
	for {
		rt, err := h.st.Runtimes().Get(h.t.Context(), "", name)
		if err != nil {
			h.t.Fatal(err)
		}
		change(&rt.Spec)
		_, err = h.st.Runtimes().Update(h.t.Context(), rt)
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "conflict") {
			h.t.Fatal(err)
		}
	}
}

// next returns the next event.
func (h *harness) next() podsource.Event {
	h.t.Helper()
	select {
	case ev, ok := <-h.events:
		if !ok {
			h.t.Fatal("events closed")
		}
		h.t.Logf("event %s %s %s slots=%d %s", ev.Type, ev.Pod.Name, ev.Pod.UID, ev.Pod.Slots, ev.Reason)
		return ev
	case <-time.After(eventTimeout):
		h.t.Fatal("no event")
	}
	panic("unreachable")
}

// expect returns the next event, which must be of type typ (and reason,
// for PodGone).
func (h *harness) expect(typ podsource.EventType, reason string) podsource.Event {
	h.t.Helper()
	ev := h.next()
	if ev.Type != typ || ev.Reason != reason {
		h.t.Fatalf("got %s %q for %s, want %s %q", ev.Type, ev.Reason, ev.Pod.Name, typ, reason)
	}
	return ev
}

// awaitStatus waits until the Runtime's status satisfies ok, following the
// store's watch.
func (h *harness) awaitStatus(name string, ok func(v1alpha1.RuntimeStatus) bool) v1alpha1.RuntimeStatus {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.t.Context(), eventTimeout)
	defer cancel()
	rts, rv, err := h.st.Runtimes().List(ctx, store.ListOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	var last v1alpha1.RuntimeStatus
	for _, rt := range rts {
		if rt.Name == name {
			last = rt.Status
			if ok(last) {
				return last
			}
		}
	}
	w, err := h.st.Runtimes().Watch(ctx, store.WatchOptions{ResourceVersion: rv})
	if err != nil {
		h.t.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.Events() {
		if ev.Type == store.Error {
			h.t.Fatalf("watch: %v", ev.Err)
		}
		if ev.Object.Name != name {
			continue
		}
		last = ev.Object.Status
		if ok(last) {
			return last
		}
	}
	h.t.Fatalf("status of %s never matched; last %+v", name, last)
	return last
}

func bashRuntime(name string, replicas, runs int32) *v1alpha1.Runtime {
	return &v1alpha1.Runtime{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.RuntimeSpec{
			Server: "bash", Replicas: replicas, Runs: runs,
			DefaultTaskTimeout: &metav1.Duration{Duration: time.Minute},
		},
	}
}

// socketPath is a pod's socket file.
func socketPath(p podsource.Pod) string { return strings.TrimPrefix(p.Addr, "unix://") }

// serverPid finds the pod's Runtime Server by its --listen argument.
func serverPid(t *testing.T, p podsource.Pod) int {
	t.Helper()
	pids := pidsWithArg("unix:" + socketPath(p))
	if len(pids) != 1 {
		t.Fatalf("runtime server processes of %s: %v", p.Name, pids)
	}
	return pids[0]
}

// pidsWithArg lists the live (non-zombie) processes with arg on their
// command line.
func pidsWithArg(arg string) []int {
	dir, _ := os.ReadDir("/proc")
	var pids []int
	for _, d := range dir {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || dead(pid) {
			continue
		}
		b, err := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		if err != nil {
			continue
		}
		for _, a := range bytes.Split(b, []byte{0}) {
			if string(a) == arg || (strings.HasSuffix(arg, "/") && strings.HasPrefix(string(a), arg)) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// dead reports whether pid is gone or a zombie: either way it runs nothing.
func dead(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	e, ok := parseStat(b)
	return !ok || e.state == 'Z' || e.state == 'X'
}

// children lists the live child processes of this test process.
func children() []int {
	table, _ := readProcTable()
	var out []int
	for pid, e := range table {
		if e.ppid == os.Getpid() && e.state != 'Z' {
			out = append(out, pid)
		}
	}
	return out
}

// checkHealth asks a pod's socket for its health.
func checkHealth(t *testing.T, p podsource.Pod) {
	t.Helper()
	conn, err := grpc.NewClient(p.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "executor.v1.Runtime"})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health of %s: %v %v", p.Name, resp, err)
	}
}

var podName = regexp.MustCompile(`^bash-[a-z0-9]{5}$`)

func TestReplicasReadyStatusAndShutdown(t *testing.T) {
	h := newHarness(t, nil)
	h.create(bashRuntime("bash", 2, 4))

	a := h.expect(podsource.PodReady, "")
	b := h.expect(podsource.PodReady, "")
	if a.Pod.UID == b.Pod.UID || a.Pod.Name == b.Pod.Name || a.Pod.Addr == b.Pod.Addr {
		t.Fatalf("pods not distinct: %+v %+v", a.Pod, b.Pod)
	}
	var pids []int
	var ipcDirs []string
	for _, p := range []podsource.Pod{a.Pod, b.Pod} {
		want := podsource.Pod{
			Namespace: "default", Runtime: "bash", Name: p.Name, UID: p.UID, Server: "bash", Slots: 4,
			Addr:          "unix://" + filepath.Join(h.data, "pods", p.Name, "rs.sock"),
			WorkspaceRoot: filepath.Join(h.data, "runs"),
		}
		if p != want {
			t.Errorf("pod %+v, want %+v", p, want)
		}
		if !podName.MatchString(p.Name) {
			t.Errorf("pod name %q", p.Name)
		}
		checkHealth(t, p)
		if got, ok := h.sup.Lookup(p.UID); !ok || got != p {
			t.Errorf("Lookup(%s) = %+v, %v", p.UID, got, ok)
		}
		pids = append(pids, serverPid(t, p))
		// Its IPC directory is on /dev/shm, recorded for a successor
		// (where /dev/shm is no writable tmpfs: in the pod's directory,
		// and not recorded).
		rec, err := os.ReadFile(filepath.Join(h.data, "pods", p.Name, ipcFile))
		if !shm.Usable() {
			if !os.IsNotExist(err) {
				t.Errorf("pod %s recorded an IPC directory without /dev/shm: %q, %v", p.Name, rec, err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		ipc := strings.TrimSpace(string(rec))
		if fi, err := os.Stat(ipc); err != nil || !fi.IsDir() || filepath.Dir(ipc) != shm.Root {
			t.Errorf("pod %s IPC directory %q: %v", p.Name, ipc, err)
		}
		ipcDirs = append(ipcDirs, ipc)
	}
	if pods := h.sup.Pods(); len(pods) != 2 {
		t.Fatalf("Pods() = %v", pods)
	}
	// A second subscriber gets both in its snapshot.
	_, snap, unsub := h.sup.Subscribe()
	unsub()
	if len(snap) != 2 || snap[0].Name > snap[1].Name {
		t.Fatalf("snapshot %v", snap)
	}

	st := h.awaitStatus("bash", func(s v1alpha1.RuntimeStatus) bool {
		if s.ReadyPods != 2 || len(s.Pods) != 2 {
			return false
		}
		for _, p := range s.Pods {
			if !p.Ready || p.LastHeartbeat == nil {
				return false
			}
		}
		return true
	})
	for _, ps := range st.Pods {
		p, ok := h.sup.Lookup(ps.UID)
		if !ok || ps.Name != p.Name || ps.Address != p.Addr {
			t.Errorf("status pod %+v does not match %+v", ps, p)
		}
	}

	// The Runtime Servers' logs reach ours with the pod's attributes.
	if logs := h.logs.String(); !strings.Contains(logs, `"msg":"runtime server listening"`) ||
		!strings.Contains(logs, `"pod":"`+a.Pod.Name+`"`) {
		t.Errorf("runtime server log lines not forwarded:\n%s", logs)
	}

	gone := h.stop()
	if len(gone) != 2 {
		t.Fatalf("gone at shutdown: %+v", gone)
	}
	for _, ev := range gone {
		if ev.Reason != podsource.ReasonShutdown || (ev.Pod.UID != a.Pod.UID && ev.Pod.UID != b.Pod.UID) {
			t.Errorf("shutdown event %+v", ev)
		}
	}
	for _, pid := range pids {
		if !dead(pid) {
			t.Errorf("runtime server %d alive after Run returned", pid)
		}
	}
	if c := children(); len(c) != 0 {
		t.Errorf("child processes left: %v", c)
	}
	if p := pidsWithArg("unix:" + h.data + "/"); len(p) != 0 {
		t.Errorf("pod processes left: %v", p)
	}
	if pods := h.sup.Pods(); len(pods) != 0 {
		t.Errorf("Pods() after shutdown = %v", pods)
	}
	if entries, _ := os.ReadDir(filepath.Join(h.data, "pods")); len(entries) != 0 {
		t.Errorf("pod directories left: %v", entries)
	}
	for _, dir := range ipcDirs {
		if _, err := os.Lstat(dir); !os.IsNotExist(err) {
			t.Errorf("pod IPC directory %s left: %v", dir, err)
		}
	}
	rt, err := h.st.Runtimes().Get(t.Context(), "", "bash")
	if err != nil {
		t.Fatal(err)
	}
	if rt.Status.ReadyPods != 0 || len(rt.Status.Pods) != 0 {
		t.Errorf("status after shutdown: %+v", rt.Status)
	}
}

func TestExitedPodIsReplaced(t *testing.T) {
	// The Runtime exists before the supervisor starts: found by the list.
	h := newHarness(t, nil, bashRuntime("bash", 1, 2))
	a := h.expect(podsource.PodReady, "").Pod
	pid := serverPid(t, a)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	gone := h.expect(podsource.PodGone, podsource.ReasonExited)
	if gone.Pod.UID != a.UID {
		t.Fatalf("gone %s, want %s", gone.Pod.UID, a.UID)
	}
	if !dead(pid) {
		t.Fatalf("PodGone before runtime server %d is dead", pid)
	}
	if _, ok := h.sup.Lookup(a.UID); ok {
		t.Fatal("gone pod still looked up")
	}
	b := h.expect(podsource.PodReady, "").Pod
	if b.UID == a.UID || b.Name == a.Name {
		t.Fatalf("replacement %s/%s reuses %s/%s", b.Name, b.UID, a.Name, a.UID)
	}
	checkHealth(t, b)
	h.awaitStatus("bash", func(s v1alpha1.RuntimeStatus) bool {
		return s.ReadyPods == 1 && len(s.Pods) == 1 && s.Pods[0].UID == b.UID && s.Pods[0].LastHeartbeat != nil
	})
	h.expectQuietStatus("bash", 10*h.sup.cfg.HealthInterval)
}

// expectQuietStatus checks that the Runtime is not written for d while
// nothing changes: heartbeats alone must not write the store (the status
// interval is the default 10 s).
func (h *harness) expectQuietStatus(name string, d time.Duration) {
	h.t.Helper()
	rt, err := h.st.Runtimes().Get(h.t.Context(), "", name)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(h.t.Context(), d)
	defer cancel()
	w, err := h.st.Runtimes().Watch(ctx, store.WatchOptions{ResourceVersion: rt.ResourceVersion})
	if err != nil {
		h.t.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.Events() {
		if ev.Type != store.Error {
			h.t.Fatalf("Runtime written while nothing changed: %s %+v", ev.Type, ev.Object.Status)
		}
	}
}

// A Runtime Server that stops answering is fenced: its processes, and
// those of the work it started in process groups of their own, are killed
// before PodGone, and the pod is replaced.
func TestUnhealthyPodIsFenced(t *testing.T) {
	h := newHarness(t, nil, bashRuntime("bash", 1, 2))
	a := h.expect(podsource.PodReady, "").Pod
	pid := serverPid(t, a)

	// A task that leaves a background child.
	sleepPid := runTask(t, a, "task1", "sleep 300 & echo $! > pid.fifo; wait")[0]
	if pgid, _ := syscall.Getpgid(sleepPid); pgid == pid {
		t.Fatalf("task child is in the server's group %d: the test would not show the sweep", pid)
	}

	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	gone := h.expect(podsource.PodGone, podsource.ReasonUnhealthy)
	if gone.Pod.UID != a.UID {
		t.Fatalf("gone %s, want %s", gone.Pod.UID, a.UID)
	}
	// The fencing invariant: at PodGone nothing of the pod runs.
	if !dead(pid) {
		t.Errorf("PodGone before runtime server %d is dead", pid)
	}
	if !dead(sleepPid) {
		t.Errorf("PodGone while the task's child %d still runs", sleepPid)
	}
	b := h.expect(podsource.PodReady, "").Pod
	if b.UID == a.UID {
		t.Fatal("replacement reuses the UID")
	}
	checkHealth(t, b)
	if !strings.Contains(h.logs.String(), `"msg":"pod unhealthy; fencing it"`) {
		t.Error("no fencing logged")
	}
}

func TestScaleDownSlotsAndDelete(t *testing.T) {
	h := newHarness(t, nil, bashRuntime("bash", 2, 4))
	a := h.expect(podsource.PodReady, "").Pod
	b := h.expect(podsource.PodReady, "").Pod
	pids := map[string]int{a.UID: serverPid(t, a), b.UID: serverPid(t, b)}

	h.update("bash", func(s *v1alpha1.RuntimeSpec) { s.Replicas = 1 })
	gone := h.expect(podsource.PodGone, podsource.ReasonScaledDown)
	if pids[gone.Pod.UID] == 0 {
		t.Fatalf("gone %+v is neither pod", gone.Pod)
	}
	if !dead(pids[gone.Pod.UID]) {
		t.Errorf("PodGone before runtime server %d is dead", pids[gone.Pod.UID])
	}
	kept := a
	if gone.Pod.UID == a.UID {
		kept = b
	}
	if pods := h.sup.Pods(); len(pods) != 1 || pods[0].UID != kept.UID {
		t.Fatalf("Pods() = %v, want only %s", pods, kept.Name)
	}
	h.awaitStatus("bash", func(s v1alpha1.RuntimeStatus) bool {
		return s.ReadyPods == 1 && len(s.Pods) == 1 && s.Pods[0].UID == kept.UID
	})

	// spec.runs changed: the kept pod is announced again with its new
	// Slots, same UID.
	h.update("bash", func(s *v1alpha1.RuntimeSpec) { s.Runs = 6 })
	again := h.expect(podsource.PodReady, "").Pod
	if again.UID != kept.UID || again.Slots != 6 {
		t.Fatalf("after runs=6: %+v", again)
	}
	if p, _ := h.sup.Lookup(kept.UID); p.Slots != 6 {
		t.Fatalf("Lookup slots %d", p.Slots)
	}

	if err := h.st.Runtimes().Delete(t.Context(), "", "bash", store.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	gone = h.expect(podsource.PodGone, podsource.ReasonRuntimeDeleted)
	if gone.Pod.UID != kept.UID {
		t.Fatalf("gone %s, want %s", gone.Pod.UID, kept.UID)
	}
	if !dead(pids[kept.UID]) {
		t.Errorf("PodGone before runtime server %d is dead", pids[kept.UID])
	}
	if pods := h.sup.Pods(); len(pods) != 0 {
		t.Fatalf("Pods() after delete = %v", pods)
	}
	if left := h.stop(); len(left) != 0 {
		t.Fatalf("pods gone at shutdown after the delete: %+v", left)
	}
}

// A pod that cannot start is retried with a doubling backoff, not in a
// tight loop, and is never announced.
func TestCrashLoopBacksOff(t *testing.T) {
	starts := make(chan time.Time, 64)
	h := newHarness(t, func(c *Config) {
		c.Command = func(podsource.Pod, []string) *exec.Cmd {
			select {
			case starts <- time.Now():
			default:
			}
			return exec.Command("bash", "-c", "echo dying >&2; exit 3")
		}
	}, bashRuntime("bash", 1, 1))
	var times []time.Time
	for len(times) < 5 {
		select {
		case s := <-starts:
			times = append(times, s)
		case <-time.After(eventTimeout):
			t.Fatalf("only %d starts", len(times))
		}
	}
	for i := 1; i < len(times); i++ {
		if gap, want := times[i].Sub(times[i-1]), backoffBase<<(i-1); gap < want {
			t.Errorf("start %d came %v after the previous, want ≥ %v", i+1, gap, want)
		}
	}
	if pods := h.sup.Pods(); len(pods) != 0 {
		t.Fatalf("Pods() = %v", pods)
	}
	if left := h.stop(); len(left) != 0 {
		t.Fatalf("never-ready pods announced as gone: %+v", left)
	}
	if !strings.Contains(h.logs.String(), `"line":"dying"`) {
		t.Error("the failing pod's output was not logged")
	}
}

// The supervisor reads time from the injected clock: a pod's heartbeat in
// the Runtime's status is the fake clock's time, not the real one.
func TestSupervisorUsesTheInjectedClock(t *testing.T) {
	t0 := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	fc := testingclock.NewFakeClock(t0)
	h := newHarness(t, func(c *Config) { c.Clock = fc }, bashRuntime("bash", 1, 1))
	h.expect(podsource.PodReady, "")
	st := h.awaitStatus("bash", func(s v1alpha1.RuntimeStatus) bool {
		return len(s.Pods) == 1 && s.Pods[0].Ready && s.Pods[0].LastHeartbeat != nil
	})
	if got := st.Pods[0].LastHeartbeat.Time; !got.Equal(t0) {
		t.Fatalf("lastHeartbeat %v, want the fake clock's %v", got, t0)
	}
}

func TestRunTwice(t *testing.T) {
	s := newIdleSupervisor(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := s.Run(ctx); err != nil {
		t.Fatalf("Run with an ended context: %v", err)
	}
	if err := s.Run(t.Context()); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("second Run: %v", err)
	}
}

func TestNewSupervisorChecksConfig(t *testing.T) {
	if _, err := NewSupervisor(Config{DataDir: t.TempDir()}); err == nil {
		t.Error("no store accepted")
	}
	st, err := sqlite.Open(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := NewSupervisor(Config{Store: st}); err == nil {
		t.Error("no data directory accepted")
	}
	s, err := NewSupervisor(Config{Store: st, DataDir: "relative"})
	if err != nil {
		t.Fatal(err)
	}
	if !filepath.IsAbs(s.cfg.DataDir) || s.cfg.HealthInterval != DefaultHealthInterval || s.cfg.UnhealthyAfter != DefaultUnhealthyAfter {
		t.Errorf("defaults not applied: %+v", s.cfg)
	}
}

// newIdleSupervisor is a supervisor on a real store that is never Run.
func newIdleSupervisor(t *testing.T) *Supervisor {
	t.Helper()
	st, err := sqlite.Open(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	s, err := NewSupervisor(Config{Store: st, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
