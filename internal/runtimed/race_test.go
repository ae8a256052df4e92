package runtimed_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/store"
)

// deletingRuns deletes the Run named victim right after runtimed's write
// of its Ready phase is stored, and answers that write only once runtimed
// has been handed the delete's event: the informer's newer version
// arrives while runtimed's own write is still in flight, as it can when
// the API server's watch is quicker than its answer.
type deletingRuns struct {
	store.Resource[*v1alpha1.Run]
	victim string
	once   sync.Once
	seen   chan struct{} // closed when the delete's event was fed
}

func (r *deletingRuns) UpdateStatus(ctx context.Context, run *v1alpha1.Run) (*v1alpha1.Run, error) {
	u, err := r.Resource.UpdateStatus(ctx, run)
	if err != nil || run.Name != r.victim || u.Status.Phase != v1alpha1.PhaseReady {
		return u, err
	}
	r.once.Do(func() {
		if derr := r.Resource.Delete(ctx, run.Namespace, run.Name, store.DeleteOptions{}); derr != nil {
			panic(derr) // the test's own store; reported by the test binary
		}
		select {
		case <-r.seen:
		case <-ctx.Done():
		}
	})
	return u, err
}

// A delete that runtimed hears of while its own status write is in flight
// is not forgotten when that write's answer comes back: the function is
// unregistered and its Run goes away.
func TestDeleteDuringOwnWrite(t *testing.T) {
	runs := &deletingRuns{victim: "racy", seen: make(chan struct{})}
	var closeSeen sync.Once
	e := newEnvWith(t, "bash", envOptions{
		runs: func(r store.Resource[*v1alpha1.Run]) store.Resource[*v1alpha1.Run] {
			runs.Resource = r
			return runs
		},
		fed: func(ev store.Event[*v1alpha1.Run]) {
			if ev.Object.Name == runs.victim && ev.Object.DeletionTimestamp != nil {
				closeSeen.Do(func() { close(runs.seen) })
			}
		},
	})
	e.submit(functionRun("racy", `handle() { :; }`, 0))
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := e.runs.Get(ctx, "default", "racy")
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a function Run deleted while runtimed wrote its Ready phase never went away")
		}
		time.Sleep(5 * time.Millisecond) // polling an observable state
	}
}
