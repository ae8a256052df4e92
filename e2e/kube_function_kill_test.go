package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// A replica's Pod deleted under steady load through both gateways (the
// kubelet's graceful stop: SIGTERM, then SIGKILL after the grace period).
func testKubeReplicaPodDeleted(t *testing.T, e *kubeEnv, g *gatewayUsers) {
	testKubeReplicaLost(t, e, g, "fn-deleted", false, func(t *testing.T, pod *corev1.Pod) {
		if err := e.kube.CoreV1().Pods(pod.Namespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete pod %s: %v", pod.Name, err)
		}
	})
}

// A replica's runtime-server process (the one holding its Python
// registrations) killed with SIGKILL under steady load, as a crash or the
// OOM killer would: the node agent restarts the container as a kubelet
// does, and the Pod lives on.
func testKubeReplicaServerKilled(t *testing.T, e *kubeEnv, g *gatewayUsers) {
	testKubeReplicaLost(t, e, g, "fn-crashed", true, func(t *testing.T, pod *corev1.Pod) {
		pid := podProcess(t, pod.Name, "runtime-server")
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill -9 the runtime-server of pod %s (pid %d): %v", pod.Name, pid, err)
		}
	})
}

// testKubeReplicaLost is a Function at 2 replicas under steady load
// through both gateways (more callers than replicas, so calls wait in the
// gateways' queues) when lose takes away one replica's Pod (or its
// process) while that replica has an invocation in flight. What a
// Knative or Lambda user expects, and seed 000's rule (never retried
// after dispatch):
//   - every call is answered 200 with its own ID, except those in flight
//     on the lost replica's Pod, which get 503 with Retry-After; those are
//     at most one per registration on that Pod and gateway (each gateway
//     may have sent one: the Runtime Server would refuse the second as
//     busy, but if it dies first nobody can tell the call did not run), so
//     no call that had not been sent to it is lost (the rest went to the
//     other replica or waited), and with inFlightFails a call in flight at
//     the loss is among them;
//   - every 200 ran exactly once, never two at a time on a registration;
//   - the Function gets back to 2 Ready replicas, which serve;
//   - nothing is left behind: none of the lost Pod's Python workers
//     lives on, and once the Function is deleted it has no Run.
func testKubeReplicaLost(t *testing.T, e *kubeEnv, g *gatewayUsers, name string, inFlightFails bool, lose func(*testing.T, *corev1.Pod)) {
	urls := e.gateways(t, 2)
	bases := gatewayBases(urls)
	fns := e.watchFunctions(t)
	defer fns.close()
	runs := e.watchRuns(t, v1alpha1.LabelFunction+"="+name)
	defer runs.close()
	_, marksDir := e.kubeFunction(t, name, v1alpha1.FunctionScale{Min: 2, Max: 2})
	fns.until(t, runBound, name+"'s 2 replicas ready", func(m map[string]*v1alpha1.Function) bool {
		f := m[name]
		return f != nil && f.Status.ReadyReplicas == 2
	})
	before := runs.until(t, runBound, "2 Ready replica Runs", func(m map[string]*v1alpha1.Run) bool {
		_, ready := replicasOf(m, name)
		return ready == 2
	})
	victimRun := anyReplica(before, name)
	victimPod := e.pod(t, runsNamespace, victimRun.Status.AssignedPod)
	onVictim := 0
	for _, r := range before {
		if r.Status.AssignedPodUID == string(victimPod.UID) {
			onVictim++
		}
	}

	const clients = 6
	var stop atomic.Bool
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed, unavailable []string
	answered := map[string]int{}
	okAfter := 0 // answered after the lost replica was replaced
	var replaced atomic.Bool
	for c := range clients {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				id := fmt.Sprintf("k%d-%d", c, i)
				a := g.invokeFn(bases[c%len(bases)], name, id, 0.2)
				mu.Lock()
				switch {
				case a.status == http.StatusOK && a.ID == id:
					answered[id]++
					if replaced.Load() {
						okAfter++
					}
				case a.status == http.StatusServiceUnavailable && a.retry != "":
					unavailable = append(unavailable, id+": "+a.String())
				default:
					failed = append(failed, id+": "+a.String()+" Retry-After "+a.retry)
				}
				mu.Unlock()
			}
		})
	}
	finish := func() {
		stop.Store(true)
		wg.Wait()
	}
	// The victim's registration has an invocation in flight: its marker
	// file's last line is a start.
	victimMarks := ""
	for deadline := time.Now().Add(runBound); ; time.Sleep(5 * time.Millisecond) { // polling an observable state (a file)
		if victimMarks == "" {
			victimMarks = registrationMarks(marksDir, victimRun)
		}
		if victimMarks != "" {
			if l := marks(t, victimMarks); len(l) > 0 && strings.HasPrefix(l[len(l)-1], "start_") {
				break
			}
		}
		if time.Now().After(deadline) {
			finish()
			t.Fatalf("the victim replica %s never had an invocation in flight (marker file %q); failed: %v", victimRun.Name, victimMarks, failed)
		}
	}
	workers := podWorkers(victimPod.Name)
	lose(t, victimPod)
	lost := time.Now()

	// A replacement: 2 Ready replicas again, the victim's gone (or, with
	// the Pod alive, registered again), then calls served after it.
	_, err := runs.await(2*runBound, func(m map[string]*v1alpha1.Run) bool {
		ready := 0
		for _, r := range m {
			if r.Labels[v1alpha1.LabelFunction] == name && r.Status.Phase == v1alpha1.PhaseReady &&
				(r.UID != victimRun.UID || r.Status.Attempt > victimRun.Status.Attempt) {
				ready++
			}
		}
		return ready == 2
	})
	if err == nil {
		replaced.Store(true)
		for deadline := time.Now().Add(runBound); ; time.Sleep(10 * time.Millisecond) { // polling the callers' tally
			mu.Lock()
			n := okAfter
			mu.Unlock()
			if n >= 2*clients {
				break
			}
			if time.Now().After(deadline) {
				err = fmt.Errorf("only %d calls answered after the replacement", n)
				break
			}
		}
	}
	finish()
	t.Logf("pod %s (%d of the 2 replicas) lost; back to 2 Ready replicas %v later; %d calls answered, %d failed 503: %v",
		victimPod.Name, onVictim, time.Since(lost).Round(time.Millisecond), len(answered), len(unavailable), unavailable)
	if err != nil {
		t.Fatalf("no replacement served: %v", err)
	}
	if len(failed) > 0 {
		t.Fatalf("%d calls failed otherwise than 503 with Retry-After: %v", len(failed), failed[:min(len(failed), 5)])
	}
	if len(unavailable) > onVictim*len(bases) {
		t.Errorf("%d calls failed 503, but at most %d could be in flight on the lost Pod's %d registrations (one per gateway): calls not yet sent to it were lost: %v",
			len(unavailable), onVictim*len(bases), onVictim, unavailable)
	}
	if inFlightFails && len(unavailable) == 0 {
		t.Error("the call in flight on the lost replica did not fail")
	}

	// Ran once each: every answered call started and ended once on one
	// registration; a start with no end is only the lost call's.
	ran := map[string]int{}
	entries, err := os.ReadDir(marksDir)
	if err != nil {
		t.Fatal(err)
	}
	cut := 0
	for _, ent := range entries {
		lines := marks(t, filepath.Join(marksDir, ent.Name()))
		for i := 0; i < len(lines); i++ {
			id, ok := strings.CutPrefix(lines[i], "start_")
			if !ok {
				t.Fatalf("registration %s: %q where a start was due", ent.Name(), lines[i])
			}
			if i+1 < len(lines) && lines[i+1] == "end_"+id {
				ran[id]++
				i++
				continue
			}
			// Cut off: the call in flight when its process died.
			cut++
			if answered[id] > 0 {
				t.Errorf("registration %s: %s never ended, yet was answered 200", ent.Name(), id)
			}
		}
	}
	if cut > onVictim {
		t.Errorf("%d invocations were cut off, more than the %d registrations of the lost Pod", cut, onVictim)
	}
	for id, n := range answered {
		if n != 1 || ran[id] != 1 {
			t.Errorf("call %s answered %d times, ran %d times", id, n, ran[id])
		}
	}

	// Nothing left behind.
	for _, p := range workers {
		if alive(p) {
			t.Errorf("a Python worker of the lost replica's Pod lives on: %d %v", p.pid, p.cmdline)
		}
	}
	if err := e.stoke.Delete().Namespace(runsNamespace).Resource("functions").Name(name).Do(context.Background()).Error(); err != nil {
		t.Fatal(err)
	}
	runs.until(t, runBound, name+"'s replicas gone", func(m map[string]*v1alpha1.Run) bool {
		all, _ := replicasOf(m, name)
		return all == 0
	})
}

// anyReplica is one Ready replica Run of Function name.
func anyReplica(m map[string]*v1alpha1.Run, name string) *v1alpha1.Run {
	for _, r := range m {
		if r.Labels[v1alpha1.LabelFunction] == name && r.Status.Phase == v1alpha1.PhaseReady {
			return r
		}
	}
	return nil
}

// registrationMarks is the marker file fnHandler keeps for run's
// registration in dir (named after its working directory, which holds
// the Run's UID), or "" while it has none.
func registrationMarks(dir string, run *v1alpha1.Run) string {
	entries, _ := os.ReadDir(dir)
	for _, ent := range entries {
		if strings.Contains(ent.Name(), string(run.UID)) || strings.Contains(ent.Name(), run.Name) {
			return filepath.Join(dir, ent.Name())
		}
	}
	return ""
}

// podProcess is the host pid of `stoke ROLE` in the Pod named pod: the
// node agent runs each container as local processes whose HOSTNAME is
// the Pod's name.
func podProcess(t *testing.T, pod, role string) int {
	t.Helper()
	var found []int
	for _, p := range processes() {
		if len(p.cmdline) < 2 || filepath.Base(p.cmdline[0]) != "stoke" || p.cmdline[1] != role || len(p.cmdline) > 2 && p.cmdline[2] == "probe" {
			continue
		}
		if hostnameOf(p.pid) == pod {
			found = append(found, p.pid)
		}
	}
	if len(found) != 1 {
		t.Fatalf("stoke %s processes of pod %s: %v, want one", role, pod, found)
	}
	return found[0]
}

// podWorkers are the Python workers running in the Pod named pod.
func podWorkers(pod string) []process {
	var ps []process
	for _, p := range processes() {
		if len(p.cmdline) > 0 && strings.HasPrefix(filepath.Base(p.cmdline[0]), "python") && hostnameOf(p.pid) == pod {
			ps = append(ps, p)
		}
	}
	return ps
}

// hostnameOf is the HOSTNAME in process pid's environment.
func hostnameOf(pid int) string {
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return ""
	}
	for _, kv := range strings.Split(string(env), "\x00") {
		if h, ok := strings.CutPrefix(kv, "HOSTNAME="); ok {
			return h
		}
	}
	return ""
}

// alive reports whether p (the same process: pid and start time) runs.
func alive(p process) bool {
	now, ok := readProcess(p.pid)
	return ok && now.start == p.start
}
