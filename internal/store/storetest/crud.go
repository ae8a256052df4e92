package storetest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/store"
)

func testCreateGet[T store.Object](e *env[T]) {
	t := e.t
	in := e.k.object(nsA, "first")
	in.SetLabels(map[string]string{"app": "x"})
	in.SetAnnotations(map[string]string{"note": "kept"})
	in.SetUID("set-by-the-caller")
	in.SetGeneration(7)
	e.k.setStatus(in, 3) // dropped: status is written with UpdateStatus only
	wantSpec := e.k.spec(in)

	got, err := e.r.Create(e.ctx, in)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if got.GetUID() == "" || got.GetUID() == "set-by-the-caller" {
		t.Errorf("uid = %q, want a new one set by the store", got.GetUID())
	}
	if got.GetResourceVersion() == "" {
		t.Error("resourceVersion is empty")
	}
	if ts := got.GetCreationTimestamp(); ts.IsZero() {
		t.Error("creationTimestamp is not set")
	}
	if got.GetGeneration() != 1 {
		t.Errorf("generation = %d, want 1", got.GetGeneration())
	}
	if got.GetDeletionTimestamp() != nil {
		t.Error("deletionTimestamp is set on a new object")
	}
	if got.GetNamespace() != nsA || got.GetName() != "first" {
		t.Errorf("identity = %s/%s, want %s/first", got.GetNamespace(), got.GetName(), nsA)
	}
	sameValue(t, "labels", got.GetLabels(), map[string]string{"app": "x"})
	sameValue(t, "annotations", got.GetAnnotations(), map[string]string{"note": "kept"})
	sameValue(t, "spec", e.k.spec(got), wantSpec)
	sameValue(t, "status after create", e.k.status(got), e.k.status(e.k.object(nsA, "zero")))

	fetched := e.get(nsA, "first")
	sameObject(t, "get after create", fetched, got)

	// Both the input and the results are the caller's own: changing them
	// changes nothing stored.
	want := got.DeepCopyObject().(T)
	in.SetLabels(map[string]string{"app": "changed-input"})
	e.k.setSpec(in, 99)
	got.GetLabels()["app"] = "changed-result"
	e.k.setSpec(got, 98)
	fetched.GetLabels()["app"] = "changed-get"
	e.k.setStatus(fetched, 97)
	sameObject(t, "get after mutating the input and returned objects", e.get(nsA, "first"), want)
}

func testCreateDefaultsAndValidation[T store.Object](e *env[T]) {
	t := e.t
	t.Run("NamespaceDefaults", func(t *testing.T) {
		got := e.create("", "no-namespace")
		if got.GetNamespace() != store.DefaultNamespace {
			t.Fatalf("namespace = %q, want %q", got.GetNamespace(), store.DefaultNamespace)
		}
		e.get(store.DefaultNamespace, "no-namespace")
		e.get("", "no-namespace") // "" means the default namespace for one object
	})
	t.Run("GenerateName", func(t *testing.T) {
		a := e.create(nsA, "", func(o T) { o.SetGenerateName("gen-") })
		b := e.create(nsA, "", func(o T) { o.SetGenerateName("gen-") })
		for _, o := range []T{a, b} {
			if !strings.HasPrefix(o.GetName(), "gen-") || len(o.GetName()) <= len("gen-") {
				t.Fatalf("generated name %q does not extend the prefix gen-", o.GetName())
			}
		}
		if a.GetName() == b.GetName() {
			t.Fatalf("two generated names are both %q", a.GetName())
		}
		e.get(nsA, a.GetName())
	})
	for _, tc := range []struct {
		name string
		edit func(T)
	}{
		{"NoName", func(o T) { o.SetName("") }},
		{"ResourceVersionSet", func(o T) { o.SetResourceVersion("5") }},
		{"InvalidName", func(o T) { o.SetName("Not_A_Name") }},
		{"InvalidLabel", func(o T) { o.SetLabels(map[string]string{"bad key!": "x"}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := e.k.object(nsA, "invalid")
			tc.edit(obj)
			_, err := e.r.Create(e.ctx, obj)
			wantErr(t, err, errdefs.ErrInvalidArgument)
			items, _, err := e.r.List(e.ctx, store.ListOptions{Namespace: nsA})
			if err != nil {
				t.Fatal(err)
			}
			for _, it := range items {
				if it.GetName() == "invalid" {
					t.Fatal("a rejected create stored the object")
				}
			}
		})
	}
}

func testAlreadyExists[T store.Object](e *env[T]) {
	t := e.t
	first := e.create(nsA, "taken")
	_, err := e.r.Create(e.ctx, e.k.object(nsA, "taken"))
	wantErr(t, err, errdefs.ErrAlreadyExists, "taken")
	sameObject(t, "object after a clashing create", e.get(nsA, "taken"), first)
	e.create(nsB, "taken") // the name is per namespace
}

func testNotFound[T store.Object](e *env[T]) {
	existing := e.create(nsA, "exists")
	missing := e.k.object(nsA, "missing")
	missing.SetResourceVersion(existing.GetResourceVersion())
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"Get", func() error { _, err := e.r.Get(e.ctx, nsA, "missing"); return err }},
		{"GetOtherNamespace", func() error { _, err := e.r.Get(e.ctx, nsB, "exists"); return err }},
		{"Update", func() error { _, err := e.r.Update(e.ctx, missing); return err }},
		{"UpdateStatus", func() error { _, err := e.r.UpdateStatus(e.ctx, missing); return err }},
		{"Delete", func() error { return e.r.Delete(e.ctx, nsA, "missing", store.DeleteOptions{}) }},
	} {
		e.t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			name := "missing"
			if tc.name == "GetOtherNamespace" {
				name = "exists"
			}
			wantErr(t, err, errdefs.ErrNotFound, name)
		})
	}
}

func testList[T store.Object](e *env[T]) {
	t := e.t
	for _, o := range []struct{ ns, name, app string }{
		{nsA, "a1", "web"}, {nsA, "a2", "batch"}, {nsA, "a3", ""},
		{nsB, "b1", "web"}, {nsB, "b2", "batch"},
	} {
		e.create(o.ns, o.name, func(obj T) {
			if o.app != "" {
				obj.SetLabels(map[string]string{"app": o.app, "tier": "t-" + o.app})
			}
		})
	}
	for _, tc := range []struct {
		name string
		opts store.ListOptions
		want []string
	}{
		{"All", store.ListOptions{}, []string{"team-a/a1", "team-a/a2", "team-a/a3", "team-b/b1", "team-b/b2"}},
		{"Namespace", store.ListOptions{Namespace: nsB}, []string{"team-b/b1", "team-b/b2"}},
		{"EmptyNamespace", store.ListOptions{Namespace: nsDefault}, []string{}},
		{"LabelEquals", store.ListOptions{LabelSelector: labels.SelectorFromSet(labels.Set{"app": "web"})}, []string{"team-a/a1", "team-b/b1"}},
		{"LabelAndNamespace", store.ListOptions{Namespace: nsA, LabelSelector: labels.SelectorFromSet(labels.Set{"app": "batch"})}, []string{"team-a/a2"}},
		{"LabelExists", store.ListOptions{LabelSelector: mustSelector(t, "app")}, []string{"team-a/a1", "team-a/a2", "team-b/b1", "team-b/b2"}},
		{"LabelNotExists", store.ListOptions{LabelSelector: mustSelector(t, "!app")}, []string{"team-a/a3"}},
		{"LabelIn", store.ListOptions{LabelSelector: mustSelector(t, "tier in (t-web, t-batch),app!=web")}, []string{"team-a/a2", "team-b/b2"}},
		{"NoMatch", store.ListOptions{LabelSelector: labels.SelectorFromSet(labels.Set{"app": "none"})}, []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			items, listRV, err := e.r.List(e.ctx, tc.opts)
			if err != nil {
				t.Fatalf("list: %v", err)
			}
			sameValue(t, "names", names(items), tc.want)
			if listRV == "" || listRV == "0" {
				t.Fatalf("list resourceVersion %q", listRV)
			}
			for _, it := range items {
				if it.GetResourceVersion() == "" || it.GetUID() == "" {
					t.Fatalf("listed %s/%s without resourceVersion or uid", it.GetNamespace(), it.GetName())
				}
			}
		})
	}
	// A list covers every write before it: a watch from its version
	// starts with the next write, nothing listed.
	_, listRV, err := e.r.List(e.ctx, store.ListOptions{Namespace: nsB})
	if err != nil {
		t.Fatal(err)
	}
	w := e.watch(store.WatchOptions{ResourceVersion: listRV})
	after := e.create(nsA, "after")
	wantEvent(t, nextEvent(t, e.cfg, w), store.Added, after)
}

func mustSelector(t testing.TB, s string) labels.Selector {
	t.Helper()
	sel, err := labels.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return sel
}

func testUpdateIgnoresStatus[T store.Object](e *env[T]) {
	t := e.t
	created := e.create(nsA, "obj")
	withStatus := e.updateStatus(created, 1)

	in := withStatus.DeepCopyObject().(T)
	e.k.setSpec(in, 5)
	e.k.setStatus(in, 9) // must be ignored
	in.SetLabels(map[string]string{"changed": "yes"})
	in.SetAnnotations(map[string]string{"a": "b"})
	in.SetFinalizers([]string{"stoke.dev/test"})
	got, err := e.r.Update(e.ctx, in)
	if err != nil {
		t.Fatalf("update: %v", err)
	}
	sameValue(t, "spec", e.k.spec(got), e.k.spec(in))
	sameValue(t, "status", e.k.status(got), e.k.status(withStatus))
	sameValue(t, "labels", got.GetLabels(), map[string]string{"changed": "yes"})
	sameValue(t, "annotations", got.GetAnnotations(), map[string]string{"a": "b"})
	sameValue(t, "finalizers", got.GetFinalizers(), []string{"stoke.dev/test"})
	newVersion(t, "update", got.GetResourceVersion(), withStatus.GetResourceVersion())
	if got.GetGeneration() != 2 {
		t.Errorf("generation = %d after a spec change, want 2", got.GetGeneration())
	}
	if gotTS, wantTS := got.GetCreationTimestamp(), created.GetCreationTimestamp(); got.GetUID() != created.GetUID() || !gotTS.Equal(&wantTS) {
		t.Error("update changed uid or creationTimestamp")
	}
	sameObject(t, "get after update", e.get(nsA, "obj"), got)

	// A metadata-only change does not move the generation.
	in = got.DeepCopyObject().(T)
	in.SetLabels(map[string]string{"changed": "again"})
	got, err = e.r.Update(e.ctx, in)
	if err != nil {
		t.Fatalf("update labels: %v", err)
	}
	if got.GetGeneration() != 2 {
		t.Errorf("generation = %d after a labels-only change, want 2", got.GetGeneration())
	}
}

func testUpdateStatusIgnoresSpec[T store.Object](e *env[T]) {
	t := e.t
	created := e.create(nsA, "obj", func(o T) { o.SetLabels(map[string]string{"keep": "me"}) })
	in := created.DeepCopyObject().(T)
	e.k.setStatus(in, 4)
	e.k.setSpec(in, 8)                                  // must be ignored
	in.SetLabels(map[string]string{"dropped": "yes"})   // must be ignored
	in.SetFinalizers([]string{"stoke.dev/not-written"}) // must be ignored
	got, err := e.r.UpdateStatus(e.ctx, in)
	if err != nil {
		t.Fatalf("update status: %v", err)
	}
	sameValue(t, "status", e.k.status(got), e.k.status(in))
	sameValue(t, "spec", e.k.spec(got), e.k.spec(created))
	sameValue(t, "labels", got.GetLabels(), map[string]string{"keep": "me"})
	if len(got.GetFinalizers()) != 0 {
		t.Errorf("finalizers = %v, want none", got.GetFinalizers())
	}
	if got.GetGeneration() != created.GetGeneration() {
		t.Errorf("generation moved from %d to %d on a status update", created.GetGeneration(), got.GetGeneration())
	}
	newVersion(t, "update status", got.GetResourceVersion(), created.GetResourceVersion())
	sameObject(t, "get after update status", e.get(nsA, "obj"), got)
}

func testConflict[T store.Object](e *env[T]) {
	t := e.t
	stale := e.create(nsA, "obj")
	current := e.updateStatus(stale, 1)
	for _, tc := range []struct {
		name     string
		edit     func(T)
		status   bool
		category error
	}{
		{"UpdateStaleVersion", func(o T) { e.k.setSpec(o, 3) }, false, errdefs.ErrConflict},
		{"UpdateStatusStaleVersion", func(o T) { e.k.setStatus(o, 3) }, true, errdefs.ErrConflict},
		{"UpdateWithoutVersion", func(o T) { o.SetResourceVersion(""); e.k.setSpec(o, 3) }, false, errdefs.ErrInvalidArgument},
		{"UpdateStatusWithoutVersion", func(o T) { o.SetResourceVersion(""); e.k.setStatus(o, 3) }, true, errdefs.ErrInvalidArgument},
		{"UpdateOtherUID", func(o T) {
			o.SetResourceVersion(current.GetResourceVersion())
			o.SetUID(types.UID("0d0c0a0b-0000-4000-8000-000000000000"))
			e.k.setSpec(o, 3)
		}, false, errdefs.ErrConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := stale.DeepCopyObject().(T)
			tc.edit(in)
			var err error
			if tc.status {
				_, err = e.r.UpdateStatus(e.ctx, in)
			} else {
				_, err = e.r.Update(e.ctx, in)
			}
			wantErr(t, err, tc.category, "obj")
			sameObject(t, "object after a rejected update", e.get(nsA, "obj"), current)
		})
	}
}

func testNoOpUpdate[T store.Object](e *env[T]) {
	t := e.t
	obj := e.updateStatus(e.create(nsA, "obj"), 1)
	w, err := e.r.Watch(e.ctx, store.WatchOptions{ResourceVersion: obj.GetResourceVersion()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	same, err := e.r.Update(e.ctx, obj)
	if err != nil {
		t.Fatalf("no-op update: %v", err)
	}
	if same.GetResourceVersion() != obj.GetResourceVersion() {
		t.Errorf("no-op update moved resourceVersion %s to %s", obj.GetResourceVersion(), same.GetResourceVersion())
	}
	same, err = e.r.UpdateStatus(e.ctx, obj)
	if err != nil {
		t.Fatalf("no-op update status: %v", err)
	}
	if same.GetResourceVersion() != obj.GetResourceVersion() {
		t.Errorf("no-op update status moved resourceVersion %s to %s", obj.GetResourceVersion(), same.GetResourceVersion())
	}
	changed := e.updateStatus(obj, 2)
	// The first event is the real change: the no-ops produced none.
	ev := nextEvent(t, e.cfg, w)
	wantEvent(t, ev, store.Modified, changed)
}

func testResourceVersionChanges[T store.Object](e *env[T]) {
	t := e.t
	w := e.watch(store.WatchOptions{})
	type write struct {
		typ      store.EventType
		name, rv string // rv is "" for a delete, which returns no object
	}
	var writes []write
	given := map[string]string{} // resourceVersion → the write that got it
	mark := func(what, v string) {
		t.Helper()
		if v == "" {
			t.Fatalf("%s: empty resourceVersion", what)
		}
		if first, ok := given[v]; ok {
			t.Fatalf("%s: resourceVersion %s was already given to %s", what, v, first)
		}
		given[v] = what
	}
	for i := range 5 {
		name := fmt.Sprintf("obj-%d", i)
		o := e.create(nsA, name)
		mark("create "+name, o.GetResourceVersion())
		writes = append(writes, write{store.Added, name, o.GetResourceVersion()})
		o = e.updateStatus(o, i+1)
		mark("update status of "+name, o.GetResourceVersion())
		writes = append(writes, write{store.Modified, name, o.GetResourceVersion()})
		e.k.setSpec(o, i+10)
		o, err := e.r.Update(e.ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		mark("update "+name, o.GetResourceVersion())
		writes = append(writes, write{store.Modified, name, o.GetResourceVersion()})
		if i%2 == 0 {
			if err := e.r.Delete(e.ctx, nsA, name, store.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			writes = append(writes, write{store.Deleted, name, ""})
		}
	}
	// Order is what Watch shows: the writes, in the order they were made,
	// at the versions they returned; deletes at versions of their own.
	for _, wr := range writes {
		ev := nextEvent(t, e.cfg, w)
		if ev.Type != wr.typ || ev.Object.GetName() != wr.name || (wr.rv != "" && ev.Object.GetResourceVersion() != wr.rv) {
			t.Fatalf("event %s %s at %s, want %s %s at %q", ev.Type, ev.Object.GetName(), ev.Object.GetResourceVersion(), wr.typ, wr.name, wr.rv)
		}
		if wr.typ == store.Deleted {
			mark("delete "+wr.name, ev.Object.GetResourceVersion())
		}
	}
	// A list covers the deletes: a watch from its version starts after them.
	_, listRV, err := e.r.List(e.ctx, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	after := e.watch(store.WatchOptions{ResourceVersion: listRV})
	last := e.create(nsA, "last")
	wantEvent(t, nextEvent(t, e.cfg, after), store.Added, last)
}

func testDeleteWithoutFinalizers[T store.Object](e *env[T]) {
	t := e.t
	e.create(nsA, "doomed")
	if err := e.r.Delete(e.ctx, nsA, "doomed", store.DeleteOptions{}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	_, err := e.r.Get(e.ctx, nsA, "doomed")
	wantErr(t, err, errdefs.ErrNotFound, "doomed")
	err = e.r.Delete(e.ctx, nsA, "doomed", store.DeleteOptions{})
	wantErr(t, err, errdefs.ErrNotFound, "doomed")
	// The name is free again, for a new object with a new uid.
	e.create(nsA, "doomed")
}

func testDeleteWithFinalizers[T store.Object](e *env[T]) {
	t := e.t
	const fin = "stoke.dev/cleanup"
	created := e.create(nsA, "held", func(o T) { o.SetFinalizers([]string{fin}) })
	w, err := e.r.Watch(e.ctx, store.WatchOptions{ResourceVersion: created.GetResourceVersion()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	if err := e.r.Delete(e.ctx, nsA, "held", store.DeleteOptions{}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	deleting := e.get(nsA, "held")
	if deleting.GetDeletionTimestamp() == nil {
		t.Fatal("delete of an object with finalizers did not set deletionTimestamp")
	}
	newVersion(t, "setting deletionTimestamp", deleting.GetResourceVersion(), created.GetResourceVersion())
	wantEvent(t, nextEvent(t, e.cfg, w), store.Modified, deleting)

	// Deleting again changes nothing: the timestamp is set once.
	if err := e.r.Delete(e.ctx, nsA, "held", store.DeleteOptions{}); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	sameObject(t, "object after a second delete", e.get(nsA, "held"), deleting)

	// No new finalizers on an object being deleted.
	in := deleting.DeepCopyObject().(T)
	in.SetFinalizers([]string{fin, "stoke.dev/another"})
	_, err = e.r.Update(e.ctx, in)
	wantErr(t, err, errdefs.ErrInvalidArgument, "held")

	// Status can still be written while the finalizer runs.
	withStatus := e.updateStatus(deleting, 7)
	if withStatus.GetDeletionTimestamp() == nil {
		t.Fatal("update status cleared deletionTimestamp")
	}
	wantEvent(t, nextEvent(t, e.cfg, w), store.Modified, withStatus)

	// Removing the last finalizer completes the deletion.
	in = withStatus.DeepCopyObject().(T)
	in.SetFinalizers(nil)
	final, err := e.r.Update(e.ctx, in)
	if err != nil {
		t.Fatalf("remove the finalizer: %v", err)
	}
	_, err = e.r.Get(e.ctx, nsA, "held")
	wantErr(t, err, errdefs.ErrNotFound, "held")
	ev := nextEvent(t, e.cfg, w)
	if ev.Type != store.Deleted || ev.Object.GetName() != "held" {
		t.Fatalf("event = %s %v, want DELETED held", ev.Type, ev.Object)
	}
	newVersion(t, "deleted event", ev.Object.GetResourceVersion(), withStatus.GetResourceVersion())
	if final.GetName() != "held" || final.GetUID() != created.GetUID() {
		t.Fatalf("update that completed the deletion returned %s/%s uid %s", final.GetNamespace(), final.GetName(), final.GetUID())
	}
}

func testDeletePreconditions[T store.Object](e *env[T]) {
	t := e.t
	first := e.create(nsA, "guarded")
	current := e.updateStatus(first, 1)
	for _, tc := range []struct {
		name string
		pre  store.Preconditions
	}{
		{"OtherUID", store.Preconditions{UID: "0d0c0a0b-0000-4000-8000-000000000000"}},
		{"StaleVersion", store.Preconditions{ResourceVersion: first.GetResourceVersion()}},
		{"MatchingUIDStaleVersion", store.Preconditions{UID: string(first.GetUID()), ResourceVersion: first.GetResourceVersion()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := e.r.Delete(e.ctx, nsA, "guarded", store.DeleteOptions{Preconditions: tc.pre})
			wantErr(t, err, errdefs.ErrConflict, "guarded")
			sameObject(t, "object after a refused delete", e.get(nsA, "guarded"), current)
		})
	}
	pre := store.Preconditions{UID: string(current.GetUID()), ResourceVersion: current.GetResourceVersion()}
	if err := e.r.Delete(e.ctx, nsA, "guarded", store.DeleteOptions{Preconditions: pre}); err != nil {
		t.Fatalf("delete with matching preconditions: %v", err)
	}
	_, err := e.r.Get(e.ctx, nsA, "guarded")
	wantErr(t, err, errdefs.ErrNotFound)
}

func testSameNameInBothKinds(t *testing.T, s store.Store, cfg *config) {
	ctx := testContext(t, cfg)
	if _, err := s.Runs().Create(ctx, runCase.object(nsA, "shared")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Runtimes().Create(ctx, runtimeCase.object(nsA, "shared")); err != nil {
		t.Fatalf("a Runtime named like a Run: %v", err)
	}
	if _, err := s.Functions().Create(ctx, functionCase.object(nsA, "shared")); err != nil {
		t.Fatalf("a Function named like a Run: %v", err)
	}
	if err := s.Runs().Delete(ctx, nsA, "shared", store.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Runtimes().Get(ctx, nsA, "shared"); err != nil {
		t.Fatalf("deleting the Run removed the Runtime: %v", err)
	}
	if _, err := s.Functions().Get(ctx, nsA, "shared"); err != nil {
		t.Fatalf("deleting the Run removed the Function: %v", err)
	}
}

func testListRunPhases(t *testing.T, s store.Store, cfg *config) {
	ctx := testContext(t, cfg)
	runs := s.Runs()
	set := func(name string, phase v1alpha1.Phase) {
		t.Helper()
		r, err := runs.Create(ctx, runCase.object(nsA, name))
		if err != nil {
			t.Fatal(err)
		}
		if phase == "" {
			return
		}
		r.Status.Phase = phase
		if _, err := runs.UpdateStatus(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	set("new", "")
	set("pending", v1alpha1.PhasePending)
	set("running", v1alpha1.PhaseRunning)
	set("ready", v1alpha1.PhaseReady)
	set("done", v1alpha1.PhaseSucceeded)
	if _, err := s.Runs().Create(ctx, runCase.object(nsB, "other-ns")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		ns     string
		phases []v1alpha1.Phase
		want   []string
	}{
		{"One", nsA, []v1alpha1.Phase{v1alpha1.PhasePending}, []string{"team-a/pending"}},
		{"Several", nsA, []v1alpha1.Phase{v1alpha1.PhaseRunning, v1alpha1.PhaseReady, v1alpha1.PhaseFailed}, []string{"team-a/ready", "team-a/running"}},
		{"NotWrittenYet", "", []v1alpha1.Phase{""}, []string{"team-a/new", "team-b/other-ns"}},
		{"NotWrittenOrPending", nsA, []v1alpha1.Phase{"", v1alpha1.PhasePending}, []string{"team-a/new", "team-a/pending"}},
		{"None", nsA, []v1alpha1.Phase{v1alpha1.PhaseCancelled}, []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			items, _, err := runs.List(ctx, store.ListOptions{Namespace: tc.ns, Phases: tc.phases})
			if err != nil {
				t.Fatal(err)
			}
			sameValue(t, "names", names(items), tc.want)
		})
	}
	t.Run("RuntimesHaveNoPhase", func(t *testing.T) {
		_, _, err := s.Runtimes().List(ctx, store.ListOptions{Phases: []v1alpha1.Phase{v1alpha1.PhasePending}})
		wantErr(t, err, errdefs.ErrInvalidArgument)
	})
}

// wantEvent fails unless ev is typ and carries want (semantically equal).
func wantEvent[T store.Object](t testing.TB, ev store.Event[T], typ store.EventType, want T) {
	t.Helper()
	if ev.Type != typ {
		t.Fatalf("event type = %s (err %v), want %s for %s/%s", ev.Type, ev.Err, typ, want.GetNamespace(), want.GetName())
	}
	sameObject(t, "event object", ev.Object, want)
}

// Pod UIDs for the assigned-pod tests.
const (
	podUID1 = "4a2c1a3e-0000-4000-8000-000000000001"
	podUID2 = "4a2c1a3e-0000-4000-8000-000000000002"
)

// assign writes a Run's status as the scheduler does when it places the
// Run on a pod (uid "" unassigns it), or fails the test.
func assign(t testing.TB, ctx context.Context, runs store.Resource[*v1alpha1.Run], r *v1alpha1.Run, phase v1alpha1.Phase, uid string) *v1alpha1.Run {
	t.Helper()
	r = r.DeepCopy()
	r.Status.Phase = phase
	r.Status.AssignedPod, r.Status.AssignedPodUID = "", uid
	if uid != "" {
		r.Status.AssignedPod = "pod-" + uid[len(uid)-1:]
	}
	out, err := runs.UpdateStatus(ctx, r)
	if err != nil {
		t.Fatalf("assign run %s/%s to %q: %v", r.Namespace, r.Name, uid, err)
	}
	return out
}

func testListAssignedPod(t *testing.T, s store.Store, cfg *config) {
	ctx := testContext(t, cfg)
	runs := s.Runs()
	for _, r := range []struct {
		ns, name string
		phase    v1alpha1.Phase
		uid      string
	}{
		{nsA, "on-1", v1alpha1.PhaseScheduled, podUID1},
		{nsA, "on-1-running", v1alpha1.PhaseRunning, podUID1},
		{nsB, "on-1-b", v1alpha1.PhaseScheduled, podUID1},
		{nsA, "on-2", v1alpha1.PhaseScheduled, podUID2},
		{nsA, "pending", v1alpha1.PhasePending, ""},
	} {
		run, err := runs.Create(ctx, runCase.object(r.ns, r.name))
		if err != nil {
			t.Fatal(err)
		}
		assign(t, ctx, runs, run, r.phase, r.uid)
	}
	for _, tc := range []struct {
		name string
		opts store.ListOptions
		want []string
	}{
		{"AllNamespaces", store.ListOptions{AssignedPodUID: podUID1}, []string{"team-a/on-1", "team-a/on-1-running", "team-b/on-1-b"}},
		{"OneNamespace", store.ListOptions{Namespace: nsA, AssignedPodUID: podUID1}, []string{"team-a/on-1", "team-a/on-1-running"}},
		{"WithPhase", store.ListOptions{AssignedPodUID: podUID1, Phases: []v1alpha1.Phase{v1alpha1.PhaseRunning}}, []string{"team-a/on-1-running"}},
		{"OtherPod", store.ListOptions{AssignedPodUID: podUID2}, []string{"team-a/on-2"}},
		{"NoRuns", store.ListOptions{AssignedPodUID: "4a2c1a3e-0000-4000-8000-000000000009"}, []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			items, _, err := runs.List(ctx, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			sameValue(t, "names", names(items), tc.want)
		})
	}
	t.Run("RuntimesHaveNoPod", func(t *testing.T) {
		_, _, err := s.Runtimes().List(ctx, store.ListOptions{AssignedPodUID: podUID1})
		wantErr(t, err, errdefs.ErrInvalidArgument)
	})
}

// testListWatchPlacedPod: ListOptions and WatchOptions.PlacedPodUID
// select the Runs whose spec.placement.podUID is the UID, whatever their
// status (a runtimed's Runs placed at their create, taken before any
// write): a write to one is seen, a Run placed elsewhere is not.
func testListWatchPlacedPod(t *testing.T, s store.Store, cfg *config) {
	ctx := testContext(t, cfg)
	runs := s.Runs()
	placed := func(ns, name, uid string) *v1alpha1.Run {
		r := runCase.object(ns, name)
		r.Spec.Placement = &v1alpha1.Placement{PodUID: uid}
		out, err := runs.Create(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	on1 := placed(nsA, "placed-1", podUID1)
	placed(nsB, "placed-1-b", podUID1)
	placed(nsA, "placed-2", podUID2)
	if _, err := runs.Create(ctx, runCase.object(nsA, "unplaced")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		opts store.ListOptions
		want []string
	}{
		{"AllNamespaces", store.ListOptions{PlacedPodUID: podUID1}, []string{"team-a/placed-1", "team-b/placed-1-b"}},
		{"OneNamespace", store.ListOptions{Namespace: nsA, PlacedPodUID: podUID1}, []string{"team-a/placed-1"}},
		{"OtherPod", store.ListOptions{PlacedPodUID: podUID2}, []string{"team-a/placed-2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			items, _, err := runs.List(ctx, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			sameValue(t, "names", names(items), tc.want)
		})
	}
	t.Run("Watch", func(t *testing.T) {
		_, rv, err := runs.List(ctx, store.ListOptions{Namespace: nsA, PlacedPodUID: podUID1})
		if err != nil {
			t.Fatal(err)
		}
		w, err := runs.Watch(ctx, store.WatchOptions{ResourceVersion: rv, Namespace: nsA, PlacedPodUID: podUID1})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		placed(nsA, "placed-2-later", podUID2)
		assign(t, ctx, runs, on1, v1alpha1.PhaseReady, podUID1)
		if ev := nextEvent(t, cfg, w); ev.Type != store.Modified || ev.Object.Name != "placed-1" || ev.Object.Status.Phase != v1alpha1.PhaseReady {
			t.Fatalf("event %s %v; want placed-1 Modified, Ready (the Run placed elsewhere is not seen)", ev.Type, ev.Object)
		}
	})
	t.Run("RuntimesHaveNoPlacement", func(t *testing.T) {
		_, _, err := s.Runtimes().List(ctx, store.ListOptions{PlacedPodUID: podUID1})
		wantErr(t, err, errdefs.ErrInvalidArgument)
	})
}
