package gateway_test

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"slices"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/gateway"
)

func decodeRun(t *testing.T, r reply) *v1alpha1.Run {
	t.Helper()
	run := &v1alpha1.Run{}
	if err := json.Unmarshal(r.body, run); err != nil {
		t.Fatalf("%s: %v", r, err)
	}
	return run
}

// A client's finalizer no longer makes a Run undeletable: a JSON merge
// patch removes it, and the deletion it held up completes; the name is
// free again.
func TestPatchRemovesAClientsFinalizer(t *testing.T) {
	url := serve(t, gateway.Config{})
	runs := url + "/v1/namespaces/default/runs"
	run := url + "/v1/namespaces/default/runs/held"
	body := `{"metadata":{"name":"held","finalizers":["x.dev/never"]},"spec":{"runtime":"bash","mode":{"task":{"args":["true"]}}}}`
	if r := do(t, http.MethodPost, runs, body, nil); r.status != http.StatusCreated {
		t.Fatalf("create: %s", r)
	}
	t.Cleanup(func() {
		_, _ = plane.PatchRun(context.Background(), "default", "held", []byte(`{"metadata":{"finalizers":null}}`))
		_, _ = plane.DeleteRun(context.Background(), "default", "held")
	})
	if r := do(t, http.MethodDelete, run, "", nil); r.status != http.StatusAccepted {
		t.Fatalf("delete: %s", r)
	}
	held := decodeRun(t, do(t, http.MethodGet, run, "", nil))
	if held.DeletionTimestamp == nil {
		t.Fatalf("the finalizer did not hold the Run: %+v", held.ObjectMeta)
	}
	wantError(t, do(t, http.MethodPost, runs, body, nil), http.StatusConflict, "Stoke.AlreadyExists", false)

	r := do(t, http.MethodPatch, run, `{"metadata":{"finalizers":null}}`, map[string]string{"Content-Type": "application/merge-patch+json"})
	if r.status != http.StatusOK {
		t.Fatalf("patch: %s", r)
	}
	wantError(t, do(t, http.MethodGet, run, "", nil), http.StatusNotFound, "Stoke.NotFound", false)
	if r := do(t, http.MethodPost, runs, body, nil); r.status != http.StatusCreated {
		t.Fatalf("create again under the freed name: %s", r)
	}
}

// patchable is what of a Run a client's patch could change.
func patchable(r *v1alpha1.Run) any {
	return struct {
		Labels, Annotations map[string]string
		Finalizers          []string
		Generation          int64
		Spec                v1alpha1.RunSpec
	}{r.Labels, r.Annotations, r.Finalizers, r.Generation, r.Spec}
}

// What a patch may change, what it may not, and its preconditions.
func TestPatchRun(t *testing.T) {
	url := serve(t, gateway.Config{})
	runs := url + "/v1/namespaces/default/runs"
	run := runs + "/patched"
	if r := do(t, http.MethodPost, runs, `{"metadata":{"name":"patched","labels":{"a":"1"}},"spec":{"runtime":"bash","mode":{"task":{"args":["true"]}}}}`, nil); r.status != http.StatusCreated {
		t.Fatalf("create: %s", r)
	}
	t.Cleanup(func() {
		// The test leaves a client's finalizer on it: remove it first.
		_, _ = plane.PatchRun(context.Background(), "default", "patched", []byte(`{"metadata":{"finalizers":null}}`))
		_, _ = plane.DeleteRun(context.Background(), "default", "patched")
	})
	// Once the task has ended nothing but patches writes the Run, so that
	// versions compare.
	var before *v1alpha1.Run
	for deadline := time.Now().Add(60 * time.Second); ; {
		before = decodeRun(t, do(t, http.MethodGet, run, "", nil))
		if before.Status.Phase.Terminal() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the task never ended: %+v", before.Status)
		}
		time.Sleep(10 * time.Millisecond) // polling an observable state
	}

	r := do(t, http.MethodPatch, run, `{"metadata":{"labels":{"a":null,"b":"2"},"annotations":{"note":"x"},"finalizers":["x.dev/hold"]},"spec":{"ttlSecondsAfterFinished":60}}`, nil)
	after := decodeRun(t, r)
	if r.status != http.StatusOK || after.Labels["b"] != "2" || after.Labels["a"] != "" || after.Annotations["note"] != "x" ||
		!slices.Equal(after.Finalizers, []string{"x.dev/hold"}) || after.Spec.TTLSecondsAfterFinished == nil || *after.Spec.TTLSecondsAfterFinished != 60 ||
		after.ResourceVersion == before.ResourceVersion {
		t.Fatalf("patch: %s", r)
	}
	// With the current resourceVersion it applies; with a stale one it is
	// 409 and changes nothing.
	if r := do(t, http.MethodPatch, run, `{"metadata":{"resourceVersion":"`+after.ResourceVersion+`","labels":{"c":"3"}}}`, nil); r.status != http.StatusOK {
		t.Fatalf("patch at the current version: %s", r)
	}
	wantError(t, do(t, http.MethodPatch, run, `{"metadata":{"resourceVersion":"`+before.ResourceVersion+`","labels":{"d":"4"}}}`, nil), http.StatusConflict, "Stoke.Aborted", false)
	wantError(t, do(t, http.MethodPatch, run, `{"metadata":{"uid":"not-this-one"}}`, nil), http.StatusConflict, "Stoke.Aborted", false)

	for name, tt := range map[string]struct {
		patch, contentType string
		status             int
		errorType          string
	}{
		"spec.runtime":           {`{"spec":{"runtime":"python"}}`, "", 400, "Stoke.InvalidArgument"},
		"spec.mode":              {`{"spec":{"mode":{"task":{"args":["false"]}}}}`, "", 400, "Stoke.InvalidArgument"},
		"status":                 {`{"status":{"reason":"patched"}}`, "", 400, "Stoke.InvalidArgument"},
		"metadata.name":          {`{"metadata":{"name":"other"}}`, "", 400, "Stoke.InvalidArgument"},
		"unknown field":          {`{"spec":{"nope":1}}`, "", 400, "Stoke.InvalidArgument"},
		"bad label":              {`{"metadata":{"labels":{"bad key":"v"}}}`, "", 400, "Stoke.InvalidArgument"},
		"not an object":          {`[]`, "", 400, "Stoke.InvalidArgument"},
		"not JSON":               {`{`, "", 400, "Stoke.InvalidArgument"},
		"JSON patch":             {`[{"op":"remove","path":"/metadata/labels"}]`, "application/json-patch+json", 400, "Stoke.InvalidArgument"},
		"cancel can't be undone": {`{"spec":{"cancelRequested":false}}`, "", 400, "Stoke.InvalidArgument"},
	} {
		t.Run(name, func(t *testing.T) {
			if name == "cancel can't be undone" {
				if r := do(t, http.MethodPatch, run, `{"spec":{"cancelRequested":true}}`, nil); r.status != http.StatusOK {
					t.Fatalf("cancel by patch: %s", r)
				}
			}
			hdr := map[string]string{}
			if tt.contentType != "" {
				hdr["Content-Type"] = tt.contentType
			}
			was := decodeRun(t, do(t, http.MethodGet, run, "", nil))
			wantError(t, do(t, http.MethodPatch, run, tt.patch, hdr), tt.status, tt.errorType, false)
			// The task runs meanwhile, so its status (and resourceVersion)
			// may move on; what a patch could write must not.
			if now := decodeRun(t, do(t, http.MethodGet, run, "", nil)); !reflect.DeepEqual(patchable(now), patchable(was)) {
				t.Errorf("a refused patch changed the Run: %+v, was %+v", patchable(now), patchable(was))
			}
		})
	}
	wantError(t, do(t, http.MethodPatch, runs+"/missing", `{}`, nil), http.StatusNotFound, "Stoke.NotFound", false)
}

// Stoke's own finalizers are Stoke's: refused at create, and kept as
// stored whatever a patch says of them.
func TestStokesFinalizersAreStokes(t *testing.T) {
	url := serve(t, gateway.Config{})
	runs := url + "/v1/namespaces/default/runs"
	wantError(t, do(t, http.MethodPost, runs, `{"metadata":{"name":"claims","finalizers":["`+v1alpha1.FinalizerRuntimed+`"]},"spec":{"runtime":"bash","mode":{"task":{"args":["true"]}}}}`, nil),
		http.StatusBadRequest, "Stoke.InvalidArgument", false)
	readyFunction(t, url, "finalized")
	fn := runs + "/finalized"
	if got := decodeRun(t, do(t, http.MethodGet, fn, "", nil)); !slices.Contains(got.Finalizers, v1alpha1.FinalizerRuntimed) {
		t.Fatalf("a Ready function without runtimed's finalizer: %v", got.Finalizers)
	}
	r := do(t, http.MethodPatch, fn, `{"metadata":{"finalizers":["x.dev/mine"]}}`, nil)
	if got := decodeRun(t, r); r.status != http.StatusOK || !slices.Equal(got.Finalizers, []string{v1alpha1.FinalizerRuntimed, "x.dev/mine"}) {
		t.Fatalf("patch: %s", r)
	}
	r = do(t, http.MethodPatch, fn, `{"metadata":{"finalizers":null}}`, nil)
	if got := decodeRun(t, r); r.status != http.StatusOK || !slices.Equal(got.Finalizers, []string{v1alpha1.FinalizerRuntimed}) {
		t.Fatalf("patch: %s", r)
	}
}
