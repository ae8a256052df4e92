package standalone_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/functionset"
	"stoke.dev/stoke/internal/gateway"
	"stoke.dev/stoke/internal/store"
)

// send makes one HTTP API call with the test token.
func sendAPI(t *testing.T, method, url, body string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Content-Type", "application/yaml")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, b}
}

const helloFunctionYAML = `apiVersion: stoke.dev/v1alpha1
kind: Function
metadata:
  name: hello
spec:
  runtime: python
  handler: handler.handle
  source:
    inline:
      path: handler.py
      text: |
        import os
        def handle(event, context):
            return {"v": os.environ.get("V", "1"), "event": event}
  scale: {min: 2, max: 4}
  drainSeconds: 1
`

// replicaRunsOf lists the Function's replica Runs.
func (p *plane) replicaRunsOf(t testing.TB, name string) []*v1alpha1.Run {
	t.Helper()
	runs, _, err := p.ListRuns(context.Background(), store.ListOptions{Namespace: "default"})
	if err != nil {
		t.Fatal(err)
	}
	var out []*v1alpha1.Run
	for _, r := range runs {
		if r.Labels[v1alpha1.LabelFunction] == name {
			out = append(out, r)
		}
	}
	return out
}

// waitReplicaRuns polls until the Function's replicas satisfy ok.
func (p *plane) waitReplicaRuns(t testing.TB, name, what string, ok func(fn *v1alpha1.Function, rs []*v1alpha1.Run) bool) []*v1alpha1.Run {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		fn, err := p.GetFunction(context.Background(), "default", name)
		rs := p.replicaRunsOf(t, name)
		if err == nil && ok(fn, rs) {
			return rs
		}
		if time.Now().After(deadline) {
			t.Fatalf("function %s never had %s: %+v, %d replicas (%v)", name, what, fn, len(rs), err)
		}
		time.Sleep(5 * time.Millisecond) // polling an observable state
	}
}

func readyServingReplicas(rs []*v1alpha1.Run, hash string) int {
	n := 0
	for _, r := range rs {
		if r.Status.Phase == v1alpha1.PhaseReady && r.DeletionTimestamp == nil &&
			r.Annotations[v1alpha1.AnnotationDraining] != "true" && (hash == "" || r.Labels[v1alpha1.LabelTemplateHash] == hash) {
			n++
		}
	}
	return n
}

func (p *plane) invokeReplicaRun(t testing.TB, r *v1alpha1.Run, input string) string {
	t.Helper()
	proxy, err := p.FunctionProxy(r)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := proxy.InvokeFunction(context.Background(), &pb.InvokeFunctionRequest{
		Registration: &pb.FunctionRegistration{RunUid: string(r.UID)}, Input: []byte(input)})
	if err != nil {
		t.Fatalf("invoke replica %s: %v", r.Name, err)
	}
	return string(resp.GetOutput())
}

// A Function through the HTTP API on stoke up's control plane: min 2 gives
// 2 Ready replicas, ordinary function Runs that answer; a killed replica is
// replaced; a spec change rolls (the new replicas Ready before the old go,
// never fewer than 2 serving); bad input changes nothing; a delete takes
// the replicas.
func TestFunctionReplicas(t *testing.T) {
	p := start(t, runtimeOf("python", 3, 4))
	srv := httptest.NewServer(gateway.New(gateway.Config{API: p, Token: testToken}))
	t.Cleanup(srv.Close)
	base := srv.URL + "/v1/namespaces/default/functions"

	if r := sendAPI(t, http.MethodPost, base, helloFunctionYAML); r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	rs := p.waitReplicaRuns(t, "hello", "2 Ready replicas", func(fn *v1alpha1.Function, rs []*v1alpha1.Run) bool {
		return fn.Status.ReadyReplicas == 2 && readyServingReplicas(rs, "") == 2 && len(rs) == 2
	})
	for _, r := range rs {
		if got := p.invokeReplicaRun(t, r, `"hi"`); got != `{"v":"1","event":"hi"}` {
			t.Fatalf("replica %s answered %s", r.Name, got)
		}
	}

	// Bad input: a clear 400 naming the field, nothing changed.
	before, err := p.GetFunction(context.Background(), "default", "hello")
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct{ body, field string }{
		{strings.Replace(helloFunctionYAML, "scale: {min: 2, max: 4}", "scale: {min: 5, max: 4}", 1), "spec.scale"},
		{strings.Replace(helloFunctionYAML, "scale: {min: 2, max: 4}", "scale: {min: 2, max: 4, idleSeconds: -1}", 1), "spec.scale.idleSeconds"},
		{strings.Replace(helloFunctionYAML, "scale: {min: 2, max: 4}", "scale: {min: 2, max: 100000}", 1), "spec.scale.max"},
		{strings.Replace(helloFunctionYAML, "drainSeconds: 1", "drainSeconds: 1\n  queue: {length: 1000000}", 1), "spec.queue.length"},
	} {
		r := sendAPI(t, http.MethodPut, base+"/hello", bad.body)
		if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), bad.field) {
			t.Fatalf("bad apply: %d %s, want 400 naming %s", r.status, r.body, bad.field)
		}
	}
	if after, err := p.GetFunction(context.Background(), "default", "hello"); err != nil || after.ResourceVersion != before.ResourceVersion {
		t.Fatalf("a refused apply changed the Function: %v", err)
	}
	if r := sendAPI(t, http.MethodGet, base, ""); r.status != http.StatusOK || !strings.Contains(string(r.body), `"kind":"FunctionList"`) {
		t.Fatalf("list: %d %s", r.status, r.body)
	}

	// A killed replica is replaced.
	victim := rs[0]
	killPod(t, victim.Status.AssignedPod)
	p.waitReplicaRuns(t, "hello", "2 Ready replicas again, none on the killed pod", func(fn *v1alpha1.Function, rs []*v1alpha1.Run) bool {
		for _, r := range rs {
			if r.UID == victim.UID || r.Status.AssignedPodUID == victim.Status.AssignedPodUID {
				return false
			}
		}
		return readyServingReplicas(rs, "") == 2
	})

	// A spec change rolls.
	oldHash := before.Status.TemplateHash
	rolled := strings.Replace(helloFunctionYAML, "drainSeconds: 1", "drainSeconds: 1\n  env: [{name: V, value: \"2\"}]", 1)
	if r := sendAPI(t, http.MethodPut, base+"/hello", rolled); r.status != http.StatusOK {
		t.Fatalf("apply: %d %s", r.status, r.body)
	}
	fn, err := p.GetFunction(context.Background(), "default", "hello")
	if err != nil {
		t.Fatal(err)
	}
	newHash := functionset.TemplateHash(fn)
	if newHash == oldHash {
		t.Fatal("the env change kept the template hash")
	}
	minServing := 2
	rs = p.waitReplicaRuns(t, "hello", "2 new Ready replicas and no old one", func(fn *v1alpha1.Function, rs []*v1alpha1.Run) bool {
		minServing = min(minServing, readyServingReplicas(rs, ""))
		for _, r := range rs {
			if r.Labels[v1alpha1.LabelTemplateHash] != newHash {
				return false
			}
		}
		return readyServingReplicas(rs, newHash) == 2 && len(rs) == 2 && fn.Status.UpdatedReplicas == 2
	})
	if minServing < 2 {
		t.Fatalf("during the roll only %d replicas served", minServing)
	}
	for _, r := range rs {
		if got := p.invokeReplicaRun(t, r, `"again"`); got != `{"v":"2","event":"again"}` {
			t.Fatalf("rolled replica %s answered %s", r.Name, got)
		}
	}

	// Delete: the replicas go.
	if r := sendAPI(t, http.MethodDelete, base+"/hello", ""); r.status != http.StatusAccepted {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	deadline := time.Now().Add(60 * time.Second)
	for len(p.replicaRunsOf(t, "hello")) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("replicas left after the Function's delete: %d", len(p.replicaRunsOf(t, "hello")))
		}
		time.Sleep(5 * time.Millisecond) // polling an observable state
	}
	if r := sendAPI(t, http.MethodGet, base+"/hello", ""); r.status != http.StatusNotFound {
		var e map[string]any
		_ = json.Unmarshal(r.body, &e)
		t.Fatalf("get after delete: %d %v", r.status, e)
	}
}

// The Function's status shows the dispatcher's load: an invocation held
// in flight through the Function URL is status.inFlight 1 (what stoke get
// functions prints), and 0 again once it answered.
func TestFunctionStatusShowsItsLoad(t *testing.T) {
	p := start(t, runtimeOf("python", 1, 2))
	ctx := context.Background()
	fn := &v1alpha1.Function{}
	fn.Name, fn.Namespace = "busy", "default"
	fn.Spec = v1alpha1.FunctionSpec{Runtime: "python", Handler: "handler.handle",
		Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "handler.py",
			Text: "import time\ndef handle(event, context):\n    time.sleep(event[\"sleep\"])\n    return {\"id\": event[\"id\"], \"replica\": \"any\"}\n"}},
		Scale: v1alpha1.FunctionScale{Min: 1, Max: 1}}
	if _, err := p.CreateFunction(ctx, fn); err != nil {
		t.Fatal(err)
	}
	p.waitReplicaRuns(t, "busy", "1 Ready replica", func(fn *v1alpha1.Function, rs []*v1alpha1.Run) bool {
		return fn.Status.ReadyReplicas == 1
	})
	srv := httptest.NewServer(gateway.New(gateway.Config{API: p.Standalone, Functions: p.Functions(), Token: testToken}))
	t.Cleanup(srv.Close)
	done := make(chan fnCall, 1)
	go func() { done <- callFunction(http.DefaultClient, functionURL(srv.URL, "busy"), "held", 3) }()
	p.waitReplicaRuns(t, "busy", "status.inFlight 1", func(fn *v1alpha1.Function, _ []*v1alpha1.Run) bool {
		return fn.Status.InFlight == 1
	})
	if r := <-done; r.err != nil || r.status != http.StatusOK {
		t.Fatalf("the held call: %d %v %s", r.status, r.err, r.body)
	}
	p.waitReplicaRuns(t, "busy", "status.inFlight 0", func(fn *v1alpha1.Function, _ []*v1alpha1.Run) bool {
		return fn.Status.InFlight == 0 && fn.Status.Queued == 0
	})
}
