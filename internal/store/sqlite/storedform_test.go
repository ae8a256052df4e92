package sqlite

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/store"
)

// TestWritesReturnTheStoredForm checks, with reflect.DeepEqual rather than
// the suite's semantic comparison, that every write returns exactly what a
// later Get decodes and what a watcher receives. Writes build that form
// without decoding their own JSON (see kind), so a field whose JSON loses
// something (sub-second times, empty maps and lists) would show up here.
func TestWritesReturnTheStoredForm(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	w, err := s.Runs().Watch(ctx, store.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	pw, err := s.Runtimes().Watch(ctx, store.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer pw.Stop()

	same := func(what string, written any, namespace, name string, events <-chan store.Event[*v1alpha1.Run]) {
		t.Helper()
		got, err := s.Runs().Get(ctx, namespace, name)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(written, got) {
			t.Fatalf("%s returned\n %s\nGet returns\n %s", what, dump(written), dump(got))
		}
		ev := <-events
		if !reflect.DeepEqual(ev.Object, got) {
			t.Fatalf("%s: the watcher got\n %s\nGet returns\n %s", what, dump(ev.Object), dump(got))
		}
	}

	now := time.Now() // sub-second, with a monotonic reading
	timeout := metav1.Duration{Duration: 90 * time.Second}
	in := &v1alpha1.Run{}
	in.Name = "form"
	in.Labels = map[string]string{}
	in.Annotations = map[string]string{"a": "b"}
	in.Finalizers = []string{}
	in.OwnerReferences = []metav1.OwnerReference{}
	in.CreationTimestamp = metav1.NewTime(now)
	in.Spec = v1alpha1.RunSpec{
		Runtime: "bash",
		Mode:    v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{}}},
		Source:  &v1alpha1.Source{Archive: &v1alpha1.ArchiveSource{TarGz: []byte{1, 2, 3}}},
		Env:     []v1alpha1.EnvVar{},
		Timeout: &timeout,
		RetryPolicy: &v1alpha1.RetryPolicy{
			MaxAttempts: 3, Backoff: &metav1.Duration{Duration: 1500 * time.Millisecond}, RetryableReasons: []string{},
		},
	}
	run, err := s.Runs().Create(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	same("create", run, "default", "form", w.Events())

	exit := int32(3)
	run.Status = v1alpha1.RunStatus{
		Phase:     v1alpha1.PhaseRunning,
		StartTime: &metav1.Time{Time: now},
		ExitCode:  &exit,
		Outputs:   map[string]string{},
		Conditions: []metav1.Condition{{
			Type: "Scheduled", Status: metav1.ConditionTrue, Reason: "Assigned", LastTransitionTime: metav1.NewTime(now),
		}},
	}
	if run, err = s.Runs().UpdateStatus(ctx, run); err != nil {
		t.Fatal(err)
	}
	same("update status", run, "default", "form", w.Events())

	run.Labels = map[string]string{}
	run.Finalizers = []string{"stoke.dev/cleanup"}
	run.Spec.Env = []v1alpha1.EnvVar{{Name: "A"}}
	run.Spec.Mode.Task.Args = nil
	if run, err = s.Runs().Update(ctx, run); err != nil {
		t.Fatal(err)
	}
	same("update", run, "default", "form", w.Events())

	if err := s.Runs().Delete(ctx, "default", "form", store.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deleting, err := s.Runs().Get(ctx, "default", "form")
	if err != nil {
		t.Fatal(err)
	}
	same("delete with a finalizer", deleting, "default", "form", w.Events())

	pool := &v1alpha1.Runtime{Spec: v1alpha1.RuntimeSpec{Server: "python", Replicas: 1, Runs: 2}}
	pool.Name = "pool"
	if pool, err = s.Runtimes().Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	<-pw.Events()
	pool.Status.Pods = []v1alpha1.PodStatus{{Name: "p", UID: "u", LastHeartbeat: &metav1.Time{Time: now}}}
	if pool, err = s.Runtimes().UpdateStatus(ctx, pool); err != nil {
		t.Fatal(err)
	}
	got, err := s.Runtimes().Get(ctx, "default", "pool")
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-pw.Events(); !reflect.DeepEqual(pool, got) || !reflect.DeepEqual(ev.Object, got) {
		t.Fatalf("runtime update status returned\n %s\nGet returns\n %s", dump(pool), dump(got))
	}
}

func dump(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
