package standalone_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/dispatch"
	"stoke.dev/stoke/internal/gateway"
	"stoke.dev/stoke/internal/store"
)

// markedHandler records each invocation's start and end in its
// replica's own marker file (MARK), from inside the registration's
// worker: a file whose lines do not alternate start/end of one call
// would show two invocations in flight on one registration.
const markedHandler = `import os, time

def handle(event, context):
    fd = os.open(os.environ["MARK"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, ("start %s\n" % event["id"]).encode())
        time.sleep(event.get("sleep", 0))
        os.write(fd, ("end %s\n" % event["id"]).encode())
    finally:
        os.close(fd)
    return {"id": event["id"], "replica": os.environ["REPLICA"]}
`

// replicaSet is a Function's replicas made by hand (the Function
// controller's job): function Runs labelled with the Function's name.
type replicaSet struct {
	fn      string
	markDir string
	names   []string
}

func createReplicas(t *testing.T, p *plane, fn string, n int) *replicaSet {
	t.Helper()
	rs := &replicaSet{fn: fn, markDir: t.TempDir()}
	if err := os.Chmod(rs.markDir, 0o777); err != nil { // the Runs' user writes there
		t.Fatal(err)
	}
	for i := range n {
		name := fmt.Sprintf("%s-%d", fn, i)
		run := pyFunction(name, markedHandler)
		run.Labels = map[string]string{v1alpha1.LabelFunction: fn}
		run.Spec.Env = []v1alpha1.EnvVar{{Name: "MARK", Value: filepath.Join(rs.markDir, name)}, {Name: "REPLICA", Value: name}}
		run.Spec.RetryPolicy = &v1alpha1.RetryPolicy{MaxAttempts: 5}
		if _, err := p.CreateRun(context.Background(), run); err != nil {
			t.Fatal(err)
		}
		rs.names = append(rs.names, name)
	}
	for _, name := range rs.names {
		p.waitRun(t, name, "Ready", phaseIs(v1alpha1.PhaseReady))
	}
	return rs
}

// check reads every replica's marker file: each start is followed by
// its own end, and it returns how many invocations each replica ran.
func (rs *replicaSet) check(t *testing.T) map[string]int {
	t.Helper()
	ran := map[string]int{}
	for _, name := range rs.names {
		b, err := os.ReadFile(filepath.Join(rs.markDir, name))
		if os.IsNotExist(err) {
			continue
		} else if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		for i := 0; i+1 < len(lines); i += 2 {
			id, ok := strings.CutPrefix(lines[i], "start ")
			if !ok || lines[i+1] != "end "+id {
				t.Fatalf("replica %s: lines %d–%d are %q, %q: two invocations in flight on one registration", name, i, i+1, lines[i], lines[i+1])
			}
		}
		if len(lines)%2 != 0 {
			t.Fatalf("replica %s: an invocation started and never ended: %q", name, lines[len(lines)-1])
		}
		ran[name] = len(lines) / 2
	}
	return ran
}

type fnCall struct {
	status int
	retry  string
	body   string
	err    error
}

func callFunction(client *http.Client, url, id string, sleep float64) fnCall {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(fmt.Sprintf(`{"id":%q,"sleep":%v}`, id, sleep)))
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return fnCall{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return fnCall{status: resp.StatusCode, retry: resp.Header.Get("Retry-After"), body: string(b), err: err}
}

// answeredBy checks an answer is the call's own and returns its replica.
func answeredBy(c fnCall, id string) (string, error) {
	var out struct{ ID, Replica string }
	if err := json.Unmarshal([]byte(c.body), &out); err != nil || out.ID != id {
		return "", fmt.Errorf("call %s answered %q: misrouted", id, c.body)
	}
	return out.Replica, nil
}

func functionURL(base, fn string) string {
	return base + "/v1/namespaces/default/functions/" + fn + "/invoke"
}

// 64 concurrent clients on a Function of 8 replicas through its stable
// URL: every call answered by its own invocation (0 misrouted, 0 lost),
// no 429 while the queue has room, all 8 replicas used, and never two
// invocations in flight on one registration, as the replicas' own
// marker files show.
func TestFunctionDispatch(t *testing.T) {
	p := start(t, runtimeOf("python", 2, 4))
	rs := createReplicas(t, p, "hello", 8)
	srv := httptest.NewServer(gateway.New(gateway.Config{API: p.Standalone, Functions: p.Functions(), Token: testToken}))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()
	url := functionURL(srv.URL, "hello")

	const clients, each = 64, 10
	var wg sync.WaitGroup
	var mu sync.Mutex
	byReplica := map[string]int{}
	var failed atomic.Int32
	for c := range clients {
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("c%d-%d", c, i)
				r := callFunction(client, url, id, 0.01)
				if r.err != nil || r.status != http.StatusOK {
					failed.Add(1)
					t.Errorf("call %s: %d %v %s", id, r.status, r.err, r.body)
					continue
				}
				rep, err := answeredBy(r, id)
				if err != nil {
					failed.Add(1)
					t.Error(err)
					continue
				}
				mu.Lock()
				byReplica[rep]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d of %d calls failed", failed.Load(), clients*each)
	}
	ran := rs.check(t)
	total := 0
	for _, name := range rs.names {
		if ran[name] != byReplica[name] {
			t.Errorf("replica %s ran %d invocations and answered %d", name, ran[name], byReplica[name])
		}
		if ran[name] == 0 {
			t.Errorf("replica %s ran nothing", name)
		}
		total += ran[name]
	}
	if total != clients*each {
		t.Fatalf("the replicas ran %d invocations for %d calls", total, clients*each)
	}
	if l := p.Functions().Dispatcher().Load(dispatch.Key{Namespace: "default", Name: "hello"}); l.InFlight != 0 || l.Queued != 0 || l.Taking != 8 {
		t.Fatalf("load after the calls: %+v", l)
	}
	t.Logf("%d calls over the replicas: %v", total, ran)

	// A name that is neither a Function nor anything: 404.
	if r := callFunction(client, functionURL(srv.URL, "nope"), "x", 0); r.status != http.StatusNotFound || !strings.Contains(r.body, "function default/nope not found") {
		t.Fatalf("unknown function: %d %s", r.status, r.body)
	}
}

// The queue's bounds, on real replicas through a gateway whose Function
// settings are small: past the length bound a call is refused at once,
// a call that waits past the wait bound is refused, both 429 with
// Retry-After, and neither reaches a replica.
func TestFunctionQueueBounds(t *testing.T) {
	p := start(t, runtimeOf("python", 1, 2))
	rs := createReplicas(t, p, "bounded", 1)
	// A gateway of its own, fed from a watch of the Runs.
	fns := gateway.NewFunctions(gateway.FunctionsConfig{Hop: p.FunctionProxy,
		Function: func(dispatch.Key) (dispatch.Settings, bool) {
			return dispatch.Settings{QueueLength: 2, QueueWait: 300 * time.Millisecond}, true
		}})
	feed(t, p, fns)
	srv := httptest.NewServer(gateway.New(gateway.Config{API: p.Standalone, Functions: fns, Token: testToken}))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	url := functionURL(srv.URL, "bounded")
	key := dispatch.Key{Namespace: "default", Name: "bounded"}
	until := func(what string, cond func(dispatch.Load) bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !cond(fns.Dispatcher().Load(key)); time.Sleep(time.Millisecond) { // polling an observable state
			if time.Now().After(deadline) {
				t.Fatalf("never %s: %+v", what, fns.Dispatcher().Load(key))
			}
		}
	}
	until("a replica", func(l dispatch.Load) bool { return l.Taking == 1 })

	slow := make(chan fnCall, 1)
	go func() { slow <- callFunction(client, url, "slow", 2) }()
	until("in flight", func(l dispatch.Load) bool { return l.InFlight == 1 })
	queued := make(chan fnCall, 2)
	for i := range 2 {
		go func() { queued <- callFunction(client, url, "q"+strconv.Itoa(i), 0) }()
	}
	until("two queued", func(l dispatch.Load) bool { return l.Queued == 2 })
	full := callFunction(client, url, "full", 0)
	if full.status != http.StatusTooManyRequests || full.retry == "" || !strings.Contains(full.body, "the most its queue holds") {
		t.Fatalf("past the queue's length: %d Retry-After %q %s", full.status, full.retry, full.body)
	}
	for range 2 {
		r := <-queued
		if r.status != http.StatusTooManyRequests || r.retry == "" || !strings.Contains(r.body, "no replica was free within") {
			t.Fatalf("past the queue's wait: %d Retry-After %q %s", r.status, r.retry, r.body)
		}
	}
	if r := <-slow; r.status != http.StatusOK {
		t.Fatalf("the slow call: %d %s", r.status, r.body)
	}
	// Only the slow call reached the replica.
	if ran := rs.check(t); ran["bounded-0"] != 1 {
		t.Fatalf("the replica ran %d invocations, want 1", ran["bounded-0"])
	}
}

// feed keeps fns's replicas from a watch of the Runs, as a second
// gateway's informer would.
func feed(t *testing.T, p *plane, fns *gateway.Functions) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	runs, rv, err := p.ListRuns(ctx, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h := fns.Handler()
	known := map[string]*v1alpha1.Run{}
	for _, run := range runs {
		known[run.Name] = run
		h.OnAdd(run)
	}
	w, err := p.WatchRuns(ctx, store.WatchOptions{ResourceVersion: rv})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.Events() {
			if ev.Object == nil {
				continue
			}
			key := ev.Object.Name
			switch old, ok := known[key]; {
			case ev.Type == store.Deleted:
				delete(known, key)
				h.OnDelete(ev.Object)
			case ok:
				known[key] = ev.Object
				h.OnUpdate(old, ev.Object)
			default:
				known[key] = ev.Object
				h.OnAdd(ev.Object)
			}
		}
	}()
	t.Cleanup(func() { cancel(); w.Stop(); <-done })
}

// Two gateways, each with its own dispatcher over the same replicas (as
// the Kubernetes gateway's two replicas are): a replica busy with one
// gateway's call refuses the other's before running it, and that
// invocation goes to another replica or waits; every call is answered
// by its own invocation, none refused while the queues have room, and
// never two in flight on one registration.
func TestTwoGatewaysShareReplicas(t *testing.T) {
	p := start(t, runtimeOf("python", 1, 4))
	rs := createReplicas(t, p, "shared", 3)
	other := gateway.NewFunctions(gateway.FunctionsConfig{Hop: p.FunctionProxy})
	feed(t, p, other)
	var bases []string
	for _, fns := range []*gateway.Functions{p.Functions(), other} {
		srv := httptest.NewServer(gateway.New(gateway.Config{API: p.Standalone, Functions: fns, Token: testToken}))
		defer srv.Close()
		bases = append(bases, srv.URL)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	defer client.CloseIdleConnections()
	const clients, each = 16, 8
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("c%d-%d", c, i)
				r := callFunction(client, functionURL(bases[c%2], "shared"), id, 0.02)
				if r.err != nil || r.status != http.StatusOK {
					t.Errorf("call %s through gateway %d: %d %v %s", id, c%2, r.status, r.err, r.body)
					continue
				}
				if _, err := answeredBy(r, id); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	total := 0
	for _, n := range rs.check(t) {
		total += n
	}
	if total != clients*each {
		t.Fatalf("the replicas ran %d invocations for %d calls", total, clients*each)
	}
}

// A replica's pod killed under load: the calls in flight on it fail with
// 503 and Retry-After, every other call is answered by its own
// invocation, and the replicas register again on the restarted pod and
// serve.
func TestFunctionReplicaPodKilled(t *testing.T) {
	p := start(t, runtimeOf("python", 2, 2))
	rs := createReplicas(t, p, "killed", 4)
	srv := httptest.NewServer(gateway.New(gateway.Config{API: p.Standalone, Functions: p.Functions(), Token: testToken}))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	defer client.CloseIdleConnections()
	url := functionURL(srv.URL, "killed")
	key := dispatch.Key{Namespace: "default", Name: "killed"}

	stop := make(chan struct{})
	var ok, unavailable atomic.Int32
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("c%d-%d", c, i)
				r := callFunction(client, url, id, 0.2)
				switch {
				case r.err != nil:
					t.Errorf("call %s: %v", id, r.err)
				case r.status == http.StatusOK:
					if _, err := answeredBy(r, id); err != nil {
						t.Error(err)
					}
					ok.Add(1)
				case r.status == http.StatusServiceUnavailable && r.retry != "":
					unavailable.Add(1)
				default:
					t.Errorf("call %s: %d Retry-After %q %s", id, r.status, r.retry, r.body)
				}
			}
		})
	}
	// Every replica busy, then one pod killed.
	for deadline := time.Now().Add(30 * time.Second); p.Functions().Dispatcher().Load(key).InFlight < 4; time.Sleep(time.Millisecond) { // polling an observable state
		if time.Now().After(deadline) {
			t.Fatalf("never 4 in flight: %+v", p.Functions().Dispatcher().Load(key))
		}
	}
	victim, err := p.GetRun(context.Background(), "default", rs.names[0])
	if err != nil {
		t.Fatal(err)
	}
	killPod(t, victim.Status.AssignedPod)
	// Until the killed replicas have registered again and each served.
	before := ok.Load()
	for _, name := range rs.names {
		p.waitRun(t, name, "Ready again", func(r *v1alpha1.Run) bool {
			return r.Status.Phase == v1alpha1.PhaseReady && (r.Status.AssignedPodUID != victim.Status.AssignedPodUID || name != victim.Name)
		})
	}
	for deadline := time.Now().Add(30 * time.Second); ok.Load() < before+16; time.Sleep(5 * time.Millisecond) { // polling an observable state
		if time.Now().After(deadline) {
			t.Fatalf("served only %d calls after the kill", ok.Load()-before)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d calls answered, %d failed 503 with the pod", ok.Load(), unavailable.Load())
	if unavailable.Load() == 0 {
		t.Error("no call failed with the killed pod")
	}
	if l := p.Functions().Dispatcher().Load(key); l.Taking != 4 || l.InFlight != 0 {
		t.Fatalf("load after: %+v", l)
	}
}

// regHandler answers with its registration's own ID (made when the
// module is imported, once per registration), so that replicas the
// Function controller makes from one template tell themselves apart.
const regHandler = `import time, uuid
REG = uuid.uuid4().hex

def handle(event, context):
    time.sleep(event.get("sleep", 0))
    return {"id": event["id"], "replica": REG}
`

// A Function object: its controller's replicas serve its stable URL, its
// spec.queue bounds the queue, and once it is deleted its name is 404.
func TestFunctionObjectIsDispatched(t *testing.T) {
	p := start(t, runtimeOf("python", 1, 4))
	ctx := context.Background()
	two := int32(2)
	fn := &v1alpha1.Function{ObjectMeta: metav1.ObjectMeta{Name: "greeter", Namespace: "default"},
		Spec: v1alpha1.FunctionSpec{Runtime: "python", Handler: "handler.handle",
			Source:   &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "handler.py", Text: regHandler}},
			Replicas: &two, Scale: v1alpha1.FunctionScale{Min: 0, Max: 2},
			Queue: v1alpha1.FunctionQueue{Length: 1, MaxWait: &metav1.Duration{Duration: 5 * time.Second}}}}
	if _, err := p.CreateFunction(ctx, fn); err != nil {
		t.Fatal(err)
	}
	key := dispatch.Key{Namespace: "default", Name: "greeter"}
	load := func() dispatch.Load { return p.Functions().Dispatcher().Load(key) }
	for deadline := time.Now().Add(60 * time.Second); load().Taking != 2; time.Sleep(5 * time.Millisecond) { // polling an observable state
		if time.Now().After(deadline) {
			t.Fatalf("never 2 replicas taking: %+v", load())
		}
	}
	srv := httptest.NewServer(gateway.New(gateway.Config{API: p.Standalone, Functions: p.Functions(), Token: testToken}))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	url := functionURL(srv.URL, "greeter")

	// Both replicas busy, one call queued: the queue of length 1 is full.
	busy := make(chan fnCall, 3)
	for i := range 2 {
		go func() { busy <- callFunction(client, url, "busy"+strconv.Itoa(i), 1.5) }()
	}
	for deadline := time.Now().Add(20 * time.Second); load().InFlight != 2; time.Sleep(time.Millisecond) { // polling an observable state
		if time.Now().After(deadline) {
			t.Fatalf("never 2 in flight: %+v", load())
		}
	}
	go func() { busy <- callFunction(client, url, "queued", 0) }()
	for deadline := time.Now().Add(20 * time.Second); load().Queued != 1; time.Sleep(time.Millisecond) { // polling an observable state
		if time.Now().After(deadline) {
			t.Fatalf("never 1 queued: %+v", load())
		}
	}
	if r := callFunction(client, url, "full", 0); r.status != http.StatusTooManyRequests || r.retry == "" || !strings.Contains(r.body, "1 invocations are waiting") {
		t.Fatalf("past spec.queue.length: %d Retry-After %q %s", r.status, r.retry, r.body)
	}
	replicas := map[string]bool{}
	for range 3 {
		r := <-busy
		if r.status != http.StatusOK {
			t.Fatalf("call: %d %s", r.status, r.body)
		}
		var out struct{ ID, Replica string }
		if err := json.Unmarshal([]byte(r.body), &out); err != nil {
			t.Fatal(err)
		}
		replicas[out.Replica] = true
	}
	if len(replicas) != 2 {
		t.Fatalf("answered by %d replicas, want 2", len(replicas))
	}

	if _, err := p.DeleteFunction(ctx, "default", "greeter"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(10 * time.Millisecond) { // polling an observable state
		r := callFunction(client, url, "gone", 0)
		if r.status == http.StatusNotFound && strings.Contains(r.body, "function default/greeter not found") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after delete: %d %s", r.status, r.body)
		}
	}
}
