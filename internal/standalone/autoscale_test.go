package standalone_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/gateway"
	"stoke.dev/stoke/internal/store"
)

// An idle Function with scale.min 0 has no replica; its first invocation
// waits in the queue while the autoscaler (poked by the dispatcher) asks
// for one, the Function controller makes it, and it registers on a warm
// pod; the invocation is then answered, and status.lastScale says 0 → 1.
func TestFunctionScalesFromZero(t *testing.T) {
	p := start(t, runtimeOf("python", 1, 2))
	ctx := context.Background()
	fn := &v1alpha1.Function{ObjectMeta: metav1.ObjectMeta{Name: "zero", Namespace: "default"},
		Spec: v1alpha1.FunctionSpec{Runtime: "python", Handler: "handler.handle",
			Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "handler.py",
				Text: "def handle(event, context):\n    return {\"id\": event[\"id\"], \"replica\": \"any\"}\n"}},
			Scale: v1alpha1.FunctionScale{Min: 0, Max: 2}}}
	if _, err := p.Store().Functions().Create(ctx, fn); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gateway.New(gateway.Config{API: p.Standalone, Functions: p.Functions(), Token: testToken}))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	runs, _, err := p.ListRuns(ctx, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range runs {
		if r.Labels[v1alpha1.LabelFunction] == "zero" {
			t.Fatalf("an idle Function with min 0 has replica %s", r.Name)
		}
	}

	begin := time.Now()
	r := callFunction(client, functionURL(srv.URL, "zero"), "first", 0)
	if r.err != nil || r.status != http.StatusOK {
		t.Fatalf("the first invocation: %d %v %s", r.status, r.err, r.body)
	}
	if _, err := answeredBy(r, "first"); err != nil {
		t.Fatal(err)
	}
	t.Logf("scale from zero to the first answer: %v (a test's figure, under -race and load)", time.Since(begin))
	// The Function controller writes lastScale with its status, a short
	// while (functionset.StatusDelay) after the scale.
	p.waitReplicaRuns(t, "zero", "lastScale 0 → 1", func(fn *v1alpha1.Function, _ []*v1alpha1.Run) bool {
		ls := fn.Status.LastScale
		return ls != nil && ls.From == 0 && ls.To == 1
	})
	got, err := p.Store().Functions().Get(ctx, "default", "zero")
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.Replicas == nil || *got.Spec.Replicas != 1 {
		t.Fatalf("spec.replicas %v, want 1", got.Spec.Replicas)
	}
}
