package functionset_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/functionset"
	"stoke.dev/stoke/internal/placement"
	"stoke.dev/stoke/internal/store"
)

// failFirstCreate is a Runs store whose first create fails.
type failFirstCreate struct {
	store.Resource[*v1alpha1.Run]
	once sync.Once
}

func (f *failFirstCreate) Create(ctx context.Context, r *v1alpha1.Run) (*v1alpha1.Run, error) {
	var failed bool
	f.once.Do(func() { failed = true })
	if failed {
		return nil, errors.New("injected create failure")
	}
	return f.Resource.Create(ctx, r)
}

// With Place set, a replica is named before its create, Place is asked
// for a slot under that name, and a replica given one is created placed
// on that pod (spec.placement.podUID and the placed annotation); one
// given none is created as before. A create that fails gives its slot
// back (Unplace).
func TestReplicasArePlacedBeforeTheirCreate(t *testing.T) {
	var mu sync.Mutex
	var asked, unplaced []string
	e := newEnvConfig(t, func(c *functionset.Config) {
		c.Runs = &failFirstCreate{Resource: c.Runs}
		c.Place = func(_ context.Context, ns, name, runtime string) (string, bool) {
			mu.Lock()
			defer mu.Unlock()
			if ns != "default" || runtime != "python" {
				t.Errorf("Place(%s, %s, %s)", ns, name, runtime)
			}
			asked = append(asked, name)
			if len(asked) <= 2 { // the failed create's, then one more
				return "pod-x", true
			}
			return "", false
		}
		c.Unplace = func(_, name string) {
			mu.Lock()
			defer mu.Unlock()
			unplaced = append(unplaced, name)
		}
	})
	fn := newFunction(2, 4)
	if fn.Spec.Runtime != "python" {
		t.Fatalf("the test Function's runtime is %q", fn.Spec.Runtime)
	}
	if _, err := e.st.Functions().Create(e.ctx, fn); err != nil {
		t.Fatal(err)
	}
	e.stepUntil("2 replicas", functionset.StatusDelay, func() bool { return len(e.replicas()) == 2 })
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 3 || len(unplaced) != 1 || unplaced[0] != asked[0] {
		t.Fatalf("Place asked for %v, Unplace for %v; want 3 names, the first given back", asked, unplaced)
	}
	var placed, plain int
	for _, r := range e.replicas() {
		if !strings.HasPrefix(r.Name, "hello-") || (r.Name != asked[1] && r.Name != asked[2]) {
			t.Errorf("replica %s: not a name Place was asked for (%v)", r.Name, asked)
		}
		switch {
		case r.Name == asked[1] && placement.Marked(r) && r.Spec.Placement.PodUID == "pod-x":
			placed++
		case r.Name == asked[2] && !placement.Marked(r) && r.Spec.Placement == nil:
			plain++
		default:
			t.Errorf("replica %s: placement %+v, annotations %v", r.Name, r.Spec.Placement, r.Annotations)
		}
	}
	if placed != 1 || plain != 1 {
		t.Errorf("%d placed and %d plain replicas, want 1 and 1", placed, plain)
	}
}
