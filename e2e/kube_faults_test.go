package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// Bounds of the fault tests.
const (
	loadRuns      = 100             // tasks in flight when the fault comes
	loadWorkers   = 8               // concurrent creations
	loadBound     = 3 * time.Minute // from the fault to every task's end
	outage        = 10 * time.Second
	createRetries = 2 * time.Minute // how long a creation is retried through an outage
)

// markerScript appends its first argument, the Run's name, to $MARKER:
// one line per execution.
const markerScript = `echo "$1" >> "$MARKER"
`

// A load is loadRuns marker tasks created in the background; each
// execution of one appends its name to a marker file on the host (the node
// agent runs containers on the host's file system).
type load struct {
	label  string
	marker string
	names  []string
	runs   *objects[*v1alpha1.Run]

	done chan struct{} // closed when every creation returned
	err  error         // the first failed creation, read after done
}

// startLoad starts creating the tasks, retrying each through an outage of
// the API server.
func (e *kubeEnv) startLoad(t *testing.T, label string, n int) *load {
	t.Helper()
	dir := e.sharedDir(t)
	l := &load{label: label, marker: filepath.Join(dir, "marker"), runs: e.watchRuns(t, "e2e="+label), done: make(chan struct{})}
	for i := range n {
		l.names = append(l.names, fmt.Sprintf("%s-%03d", label, i))
	}
	ctx, cancel := context.WithCancel(context.Background())
	names := make(chan string)
	var wg sync.WaitGroup
	var once sync.Once
	for range loadWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range names {
				if err := createRetrying(ctx, e, l.markerTask(name)); err != nil {
					once.Do(func() { l.err = err; cancel() })
				}
			}
		}()
	}
	go func() {
		defer close(l.done)
		defer cancel()
	feed:
		for _, name := range l.names {
			select {
			case names <- name:
			case <-ctx.Done():
				break feed
			}
		}
		close(names)
		wg.Wait()
	}()
	t.Cleanup(func() { cancel(); <-l.done })
	return l
}

func (l *load) markerTask(name string) *v1alpha1.Run {
	spec := task("bash", "mark.sh", markerScript, name)
	spec.Env = []v1alpha1.EnvVar{{Name: "MARKER", Value: l.marker}}
	return labelled(newRun(name, spec), l.label)
}

// createRetrying creates run, retrying with backoff (100 ms doubling to
// 2 s) while the API server is away; a creation that succeeded although
// its answer was lost comes back as AlreadyExists.
func createRetrying(ctx context.Context, e *kubeEnv, run *v1alpha1.Run) error {
	ctx, cancel := context.WithTimeout(ctx, createRetries)
	defer cancel()
	backoff := 100 * time.Millisecond
	for {
		_, err := e.createRun(ctx, run.DeepCopy())
		if err == nil || apierrors.IsAlreadyExists(err) {
			return nil
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-t.C:
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// succeeded counts the load's Succeeded Runs.
func (l *load) succeeded(m map[string]*v1alpha1.Run) int {
	n := 0
	for _, r := range m {
		if r.Status.Phase == v1alpha1.PhaseSucceeded {
			n++
		}
	}
	return n
}

// awaitSome waits until n of the load's tasks have Succeeded: the load is
// under way.
func (l *load) awaitSome(t *testing.T, n int) {
	t.Helper()
	l.runs.until(t, loadBound, fmt.Sprintf("%d %s tasks Succeeded", n, l.label), func(m map[string]*v1alpha1.Run) bool {
		return l.succeeded(m) >= n
	})
}

// finish waits for every creation and every task's end, and asserts the
// guarantees: no Run lost, none stuck, every one Succeeded, and exactly
// one marker line per Run: none ran twice.
func (l *load) finish(t *testing.T) {
	t.Helper()
	<-l.done
	if l.err != nil {
		t.Fatalf("creating the %s tasks: %v", l.label, l.err)
	}
	final, err := l.runs.await(loadBound, func(m map[string]*v1alpha1.Run) bool {
		for _, name := range l.names {
			if r := m[name]; r == nil || !terminal(r.Status.Phase) {
				return false
			}
		}
		return true
	})
	phases := map[string][]string{}
	for _, name := range l.names {
		p := "lost"
		if r := final[name]; r != nil {
			p = string(r.Status.Phase)
			if p == "" {
				p = "(none)"
			}
			if r.Status.Phase != v1alpha1.PhaseSucceeded {
				p += fmt.Sprintf(" %s %q attempt %d on %s", r.Status.Reason, r.Status.Message, r.Status.Attempt, r.Status.AssignedPod)
			}
		}
		phases[p] = append(phases[p], name)
	}
	if err != nil || len(phases) != 1 || phases[string(v1alpha1.PhaseSucceeded)] == nil {
		t.Fatalf("the %s tasks did not all succeed (%v): %s", l.label, err, summary(phases))
	}
	lines := markerLines(t, l.marker)
	for _, name := range l.names {
		if lines[name] != 1 {
			t.Errorf("task %s Succeeded and ran %d times", name, lines[name])
		}
		delete(lines, name)
	}
	if len(lines) > 0 {
		t.Errorf("marker lines of no task of the load: %v", lines)
	}
}

func summary(phases map[string][]string) string {
	var out []string
	for p, names := range phases {
		sort.Strings(names)
		if len(names) > 5 {
			names = append(names[:5:5], "…")
		}
		out = append(out, fmt.Sprintf("%d %s (%s)", len(phases[p]), p, strings.Join(names, " ")))
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}

// markerLines counts the marker file's lines by content.
func markerLines(t *testing.T, path string) map[string]int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("marker: %v", err)
	}
	defer f.Close()
	counts := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		counts[sc.Text()]++
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("marker: %v", err)
	}
	return counts
}

// leaderPod is the controller Pod whose replica holds the leader Lease:
// its identity is the Pod's name (its hostname), alone or followed by "_"
// and a unique suffix, as controller-runtime's leader election makes it.
func (e *kubeEnv) leaderPod(t *testing.T, identity string) string {
	t.Helper()
	pods, err := e.kube.CoreV1().Pods(stokeNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods.Items {
		if identity == p.Name || strings.HasPrefix(identity, p.Name+"_") {
			return p.Name
		}
		names = append(names, p.Name)
	}
	t.Fatalf("leader %q is none of the controller's pods %v", identity, names)
	return ""
}

// controllerProcess is the host pid of `stoke controller` in the Pod
// named pod: the node agent runs it as a local process whose HOSTNAME is
// the Pod's name.
func controllerProcess(t *testing.T, pod string) int {
	t.Helper()
	var found []int
	for _, p := range processes() {
		if len(p.cmdline) < 2 || filepath.Base(p.cmdline[0]) != "stoke" || p.cmdline[1] != "controller" ||
			len(p.cmdline) > 2 && p.cmdline[2] == "probe" { // the exec probe, every 2 s
			continue
		}
		env, err := os.ReadFile("/proc/" + strconv.Itoa(p.pid) + "/environ")
		if err != nil {
			continue
		}
		for _, kv := range strings.Split(string(env), "\x00") {
			if kv == "HOSTNAME="+pod {
				found = append(found, p.pid)
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("stoke controller processes of pod %s: %v, want one", pod, found)
	}
	return found[0]
}

// Killing the leader controller with SIGKILL while tasks are in flight:
// another replica takes the Lease over, and every task ends Succeeded
// having run exactly once.
func testLeaderKilled(t *testing.T, e *kubeEnv) {
	leases := e.watchLeases(t, stokeNamespace)
	holder := e.awaitLeader(t, runBound)
	victim := e.leaderPod(t, holder)
	pid := controllerProcess(t, victim)

	l := e.startLoad(t, "leader", loadRuns)
	l.awaitSome(t, 10)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 the leader (pod %s, pid %d): %v", victim, pid, err)
	}
	killed := time.Now()
	after := leases.until(t, loadBound, "a new leader", func(m map[string]*coordinationv1.Lease) bool {
		l := m[controllerName]
		return l != nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" && *l.Spec.HolderIdentity != holder
	})[controllerName]
	t.Logf("leader %s (pod %s) killed; %s took over after %v", holder, victim, *after.Spec.HolderIdentity, time.Since(killed).Round(time.Millisecond))
	l.finish(t)
}

// Stopping the API server for 10 s while tasks are in flight: every
// component recovers by itself (a leader renews its Lease, every Runtime
// has its Pods ready, a function Ready before the outage answers, a new
// task succeeds), and every task of the load ends Succeeded having run
// exactly once.
func testAPIServerStopped(t *testing.T, e *kubeEnv) {
	runs := e.watchRuns(t, "e2e=outage-fn")
	fn := e.mustCreateRun(t, labelled(newRun("steady", function("bash", "fn.handle", "fn.sh",
		`handle() { printf '{"got":%s}' "$1"; }`)), "outage-fn"))
	runs.until(t, runBound, "steady Ready", func(m map[string]*v1alpha1.Run) bool {
		return phaseOf(m, fn.Name) == v1alpha1.PhaseReady
	})
	creds := e.gatewayCredentials(t)

	l := e.startLoad(t, "outage", loadRuns)
	l.awaitSome(t, 10)
	e.cluster.StopAPIServer(t)
	// The outage the issue asks for: its length, not a synchronisation.
	time.Sleep(outage)
	e.cluster.StartAPIServer(t)
	restarted := time.Now()
	l.finish(t)

	leases := e.watchLeases(t, stokeNamespace)
	leases.until(t, runBound, "a leader renewing after the outage", func(m map[string]*coordinationv1.Lease) bool {
		l := m[controllerName]
		return l != nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" &&
			l.Spec.RenewTime != nil && l.Spec.RenewTime.After(restarted)
	})
	e.awaitRuntimesReady(t, runBound)
	ready := runs.until(t, runBound, "steady Ready after the outage", func(m map[string]*v1alpha1.Run) bool {
		return phaseOf(m, fn.Name) == v1alpha1.PhaseReady
	})[fn.Name]
	if resp, err := invokeHop(e.gatewayConn(t, creds, ready), ready, `[3]`); err != nil || string(resp.GetOutput()) != `{"got":[3]}` {
		t.Errorf("steady after the outage (attempt %d on %s): %v %v", ready.Status.Attempt, ready.Status.AssignedPod, resp, err)
	}
	t.Logf("steady after the outage: attempt %d on %s", ready.Status.Attempt, ready.Status.AssignedPod)

	after := e.startLoad(t, "after-outage", 1)
	after.finish(t)
	e.deleteRun(t, fn.Name)
}
