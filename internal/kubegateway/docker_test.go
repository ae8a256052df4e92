package kubegateway

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/informer"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/sqlite"
)

// The Docker API's Run watch comes from the gateway's Run informer: an
// event of the namespace comes once the informer holds it; the
// informer's replay of what it held before is not an event; other
// namespaces' Runs are not either.
func TestDockerWatchFollowsTheInformer(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st, err := sqlite.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	mk := func(ns, name string) {
		t.Helper()
		run := &v1alpha1.Run{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"true"}}}}}
		if _, err := st.Runs().Create(ctx, run); err != nil {
			t.Fatal(err)
		}
	}
	mk("team", "before")
	inf := informer.New(st.Runs(), informer.Options{})
	done := make(chan error, 1)
	go func() { done <- inf.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if err := inf.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	b := newDockerBackend(ctx, nil, st.Runs(), st.Runtimes(), inf)
	w, err := b.WatchRuns(ctx, store.WatchOptions{Namespace: "team"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	mk("other", "elsewhere")
	mk("team", "after")
	select {
	case ev := <-w.Events():
		if ev.Type != store.Added || ev.Object.Name != "after" {
			t.Fatalf("first event %s %s, want ADDED after", ev.Type, ev.Object.Name)
		}
		if _, ok := b.CachedRun("team", "after"); !ok {
			t.Error("the event came before the informer held the Run")
		}
	case <-time.After(time.Minute):
		t.Fatal("no event")
	}
	w.Stop()
	w.Stop()
	if _, ok := <-w.Events(); ok {
		t.Error("an event after Stop")
	}

	// CreateRun answers once the informer holds the Run (the routes
	// that follow read it from there), and wants its Runtime there.
	run := &v1alpha1.Run{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "made"},
		Spec: v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"true"}}}}}
	if _, err := b.CreateRun(ctx, run.DeepCopy()); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "runtime team/bash not found") {
		t.Fatalf("CreateRun without its Runtime: %v", err)
	}
	rt := &v1alpha1.Runtime{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "bash"}, Spec: v1alpha1.RuntimeSpec{Server: "bash", Replicas: 1, Runs: 1}}
	if _, err := st.Runtimes().Create(ctx, rt); err != nil {
		t.Fatal(err)
	}
	created, err := b.CreateRun(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := b.CachedRun("team", "made"); !ok || got.UID != created.UID {
		t.Errorf("CreateRun answered before the informer held the Run")
	}
}
