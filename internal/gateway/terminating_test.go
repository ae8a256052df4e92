package gateway_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/gateway"
)

// A function Run whose deletion a client's finalizer holds shows that it
// is terminating (reason and Ready condition Terminating), and an
// invocation gets 503 saying why, with no Retry-After: it will not be
// Ready again. Removing the finalizer completes the deletion.
func TestFunctionBeingDeletedIsTerminating(t *testing.T) {
	url := serve(t, gateway.Config{})
	fn := readyFunction(t, url, "held-fn")
	run := url + "/v1/namespaces/default/runs/held-fn"
	if r := do(t, http.MethodPatch, run, `{"metadata":{"finalizers":["example.com/hold"]}}`, nil); r.status != http.StatusOK {
		t.Fatalf("adding a finalizer: %s", r)
	}
	t.Cleanup(func() { do(t, http.MethodPatch, run, `{"metadata":{"finalizers":null}}`, nil) })
	if r := do(t, http.MethodDelete, run, "", nil); r.status != http.StatusAccepted {
		t.Fatalf("delete: %s", r)
	}

	deadline := time.Now().Add(30 * time.Second)
	var got *v1alpha1.Run
	for {
		got, _ = plane.CachedRun("default", "held-fn")
		if c := meta.FindStatusCondition(got.Status.Conditions, "Ready"); c != nil && c.Status == "False" && c.Reason == "Terminating" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Run being deleted never showed Terminating: %+v", got.Status)
		}
		time.Sleep(10 * time.Millisecond) // polling an observable state
	}
	if got.DeletionTimestamp == nil || got.Status.Reason != "Terminating" {
		t.Errorf("status %+v, deletionTimestamp %v; want reason Terminating", got.Status, got.DeletionTimestamp)
	}

	r := do(t, http.MethodPost, fn, `"x"`, nil)
	body := wantError(t, r, http.StatusServiceUnavailable, "Stoke.FailedPrecondition", true)
	if !strings.Contains(body.ErrorMessage, "is being deleted") {
		t.Errorf("message %q does not say the Run is being deleted", body.ErrorMessage)
	}
	if ra := r.header.Get("Retry-After"); ra != "" {
		t.Errorf("Retry-After %q for a Run that will not be Ready again", ra)
	}

	// The client lets it go: the deletion completes.
	if r := do(t, http.MethodPatch, run, `{"metadata":{"finalizers":null}}`, nil); r.status != http.StatusOK {
		t.Fatalf("removing the finalizer: %s", r)
	}
	for {
		if _, err := plane.GetRun(context.Background(), "default", "held-fn"); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the Run outlived its last finalizer")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
