package kubepods_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	testingclock "k8s.io/utils/clock/testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/kubepods"
	"stoke.dev/stoke/internal/kubepods/kubepodstest"
	"stoke.dev/stoke/internal/kubetest"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/kube"
)

// waitTimeout bounds every wait for an event; nothing sleeps. After the
// API server restarts, client-go's informers may wait out a backoff of up
// to 30 s before they list again.
const waitTimeout = 90 * time.Second

const (
	ns    = "default"
	grace = time.Minute
)

type env struct {
	t       *testing.T
	ctx     context.Context
	cluster *kubetest.Cluster
	kc      kubernetes.Interface
	st      store.Store
	clk     *testingclock.FakeClock
	src     *kubepods.Source
	events  <-chan podsource.Event
}

// newEnv starts a cluster (API server and etcd only: no kubelet, no
// scheduler), the Runtime bash (3 slots per Pod) and a Source on a fake
// clock, subscribed.
func newEnv(t *testing.T, log *slog.Logger) *env {
	c := kubetest.Start(t, kubetest.Options{})
	kc, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kube.New(c.Config, kube.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx, cancel := context.WithCancel(t.Context())
	e := &env{t: t, ctx: ctx, cluster: c, kc: kc, st: st, clk: testingclock.NewFakeClock(time.Now())}
	rt := &v1alpha1.Runtime{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bash"},
		Spec: v1alpha1.RuntimeSpec{Server: "bash", Replicas: 1, Runs: 3}}
	if _, err := st.Runtimes().Create(ctx, rt); err != nil {
		t.Fatal(err)
	}
	rts := informer.New(st.Runtimes(), informer.Options{})
	e.src, err = kubepods.New(kubepods.Config{Client: kc, Runtimes: rts, NotReadyGrace: grace, Clock: e.clk, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = rts.Run(ctx) })
	wg.Go(func() {
		if err := e.src.Run(ctx); err != nil {
			t.Errorf("kubepods: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	select {
	case <-e.src.Synced():
	case <-time.After(waitTimeout):
		t.Fatal("the source did not sync")
	}
	events, snapshot, unsubscribe := e.src.Subscribe()
	t.Cleanup(unsubscribe)
	if len(snapshot) != 0 {
		t.Fatalf("snapshot of an empty cluster: %v", snapshot)
	}
	e.events = events
	return e
}

// next returns the next pod event.
func (e *env) next() podsource.Event {
	e.t.Helper()
	select {
	case ev := <-e.events:
		return ev
	case <-time.After(waitTimeout):
		e.t.Fatal("no pod event")
		return podsource.Event{}
	}
}

// expect takes the next event and checks its type, pod, slots and reason.
func (e *env) expect(typ podsource.EventType, pod *corev1.Pod, slots int32, reason string) podsource.Event {
	e.t.Helper()
	ev := e.next()
	if ev.Type != typ || ev.Pod.UID != string(pod.UID) || ev.Reason != reason || (typ == podsource.PodReady && ev.Pod.Slots != slots) {
		e.t.Fatalf("got %s %s (uid %s) slots %d reason %q; want %s %s slots %d reason %q",
			ev.Type, ev.Pod.Name, ev.Pod.UID, ev.Pod.Slots, ev.Reason, typ, pod.Name, slots, reason)
	}
	return ev
}

// createPod creates a runtime Pod of bash; nothing runs it.
func (e *env) createPod(name string) *kubepodstest.Pod {
	e.t.Helper()
	return kubepodstest.Create(e.t, e.kc, ns, "bash", name)
}

// sentinel creates a Ready Pod with a long Lease and awaits its PodReady
// with slots: the source handles events in order, so once it comes, the
// source has seen what happened before. The Pod and Lease informers are
// two watches, so the Lease can be seen before the Pod's Ready status:
// the Pod is then announced first without slots, which is skipped.
func (e *env) sentinel(name, ip string, slots int32) *kubepodstest.Pod {
	e.t.Helper()
	p := e.createPod(name)
	p.SetReady(e.t, true, ip)
	p.Renew(e.t, 60)
	for {
		ev := e.next()
		if ev.Type == podsource.PodReady && ev.Pod.UID == string(p.UID) && ev.Pod.Slots == 0 && ev.Reason == "" && slots != 0 {
			continue
		}
		if ev.Type != podsource.PodReady || ev.Pod.UID != string(p.UID) || ev.Reason != "" || ev.Pod.Slots != slots {
			e.t.Fatalf("got %s %s (uid %s) slots %d reason %q; want PodReady %s slots %d",
				ev.Type, ev.Pod.Name, ev.Pod.UID, ev.Pod.Slots, ev.Reason, name, slots)
		}
		return p
	}
}

// mustBeDeleted checks that the Pod is gone from the API (an unscheduled
// Pod is removed at once; the source deletes before it sends PodGone).
func (e *env) mustBeDeleted(pod *corev1.Pod) {
	e.t.Helper()
	got, err := e.kc.CoreV1().Pods(ns).Get(e.ctx, pod.Name, metav1.GetOptions{})
	if err == nil && got.UID == pod.UID {
		e.t.Fatalf("pod %s was not deleted", pod.Name)
	}
	if err != nil && !apierrors.IsNotFound(err) {
		e.t.Fatal(err)
	}
}

// Each transition of a runtime Pod, through a real API server: alive,
// Ready, a Runtime change, NotReady, NotReady past the grace, an expired
// Lease, a deletion.
func TestPodTransitions(t *testing.T) {
	e := newEnv(t, nil)

	// A Pod that runs nothing yet is not announced; once its runtimed
	// renews the Lease it is, without slots, until it is Ready.
	a := e.createPod("bash-a")
	a.Renew(t, 120) // longer than the grace: only NotReady counts below
	e.expect(podsource.PodReady, a.Pod, 0, "")
	a.SetReady(t, true, "127.0.0.2")
	ev := e.expect(podsource.PodReady, a.Pod, 3, "")
	want := podsource.Pod{Namespace: ns, Runtime: "bash", Name: "bash-a", UID: string(a.UID), Server: "bash", Slots: 3,
		Addr: "127.0.0.2:7443", WorkspaceRoot: kubepods.WorkspaceRoot}
	if ev.Pod != want {
		t.Fatalf("ready pod %+v, want %+v", ev.Pod, want)
	}
	if got := e.src.Pods(); len(got) != 1 || got[0] != want {
		t.Fatalf("Pods() = %+v", got)
	}

	// spec.runs changes the slots in place.
	rt, err := e.st.Runtimes().Get(e.ctx, ns, "bash")
	if err != nil {
		t.Fatal(err)
	}
	rt.Spec.Runs = 5
	if _, err := e.st.Runtimes().Update(e.ctx, rt); err != nil {
		t.Fatal(err)
	}
	e.expect(podsource.PodReady, a.Pod, 5, "")

	// NotReady: no new Runs, and fenced (and deleted) once the grace has
	// passed on the source's clock.
	a.SetReady(t, false, "127.0.0.2")
	e.expect(podsource.PodReady, a.Pod, 0, "")
	e.clk.Step(grace)
	e.expect(podsource.PodGone, a.Pod, 0, podsource.ReasonNotReady)
	e.mustBeDeleted(a.Pod)
	if got := e.src.Pods(); len(got) != 0 {
		t.Fatalf("Pods() after the fence = %+v", got)
	}

	// A Ready Pod whose runtimed stops renewing: fenced once its Lease
	// duration has passed since the source last saw it renewed.
	b := e.createPod("bash-b")
	b.SetReady(t, true, "127.0.0.3")
	b.Renew(t, 10)
	e.expect(podsource.PodReady, b.Pod, 5, "")
	e.clk.Step(5 * time.Second)
	b.Renew(t, 10) // seen at +5 s: fresh until +15 s
	c := e.sentinel("bash-c", "127.0.0.4", 5)
	e.clk.Step(9 * time.Second)
	e.sentinel("bash-d", "127.0.0.5", 5) // b still counts at +14 s
	e.clk.Step(2 * time.Second)
	e.expect(podsource.PodGone, b.Pod, 0, podsource.ReasonLeaseExpired)
	e.mustBeDeleted(b.Pod)

	// A deleted Pod is fenced at once.
	if err := e.kc.CoreV1().Pods(ns).Delete(e.ctx, c.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.expect(podsource.PodGone, c.Pod, 0, podsource.ReasonPodDeleted)
}

// A Lease that looks expired while the API server cannot be reached fences
// nothing: the source asks the API server first, and counts a Lease fresh
// for its whole duration after the API server answers again.
func TestNoFenceWhileTheAPIServerIsDown(t *testing.T) {
	unreadable := make(chan struct{}, 16)
	e := newEnv(t, slog.New(&signalHandler{match: "cannot read a Lease", ch: unreadable}))
	b := e.createPod("bash-b")
	b.SetReady(t, true, "127.0.0.3")
	b.Renew(t, 10)
	e.expect(podsource.PodReady, b.Pod, 3, "")

	e.cluster.StopAPIServer(t)
	e.clk.Step(11 * time.Second) // past b's Lease: the source asks the API server
	select {
	case <-unreadable:
	case <-time.After(waitTimeout):
		t.Fatal("the source did not try to read the Lease")
	}
	e.cluster.StartAPIServer(t)
	e.clk.Step(time.Second) // the source reads again, and the API server answers
	e.sentinel("bash-d", "127.0.0.5", 3)
	e.clk.Step(9 * time.Second)
	// b has not renewed since before the outage, yet it is still ready.
	e.sentinel("bash-f", "127.0.0.6", 3)
	e.clk.Step(time.Second) // 10 s after the API server answered again
	e.expect(podsource.PodGone, b.Pod, 0, podsource.ReasonLeaseExpired)
}

// signalHandler is a slog.Handler that signals each record whose message
// contains match.
type signalHandler struct {
	match string
	ch    chan<- struct{}
}

func (h *signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *signalHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *signalHandler) WithGroup(string) slog.Handler            { return h }
func (h *signalHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.match) {
		select {
		case h.ch <- struct{}{}:
		default:
		}
	}
	return nil
}
