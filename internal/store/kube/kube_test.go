package kube_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"k8s.io/client-go/rest"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/kubetest"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/kube"
	"stoke.dev/stoke/internal/store/storetest"
)

// The namespaces the conformance suite writes to, besides "default".
var suiteNamespaces = []string{"team-a", "team-b"}

// startCluster starts an API server and etcd with the CRDs installed and
// the suite's namespaces created.
func startCluster(t testing.TB) *kubetest.Cluster {
	t.Helper()
	c := kubetest.Start(t, kubetest.Options{})
	for _, ns := range suiteNamespaces {
		c.Kubectl(t, "create", "namespace", ns)
	}
	return c
}

func open(t testing.TB, cfg *rest.Config, opts kube.Options) *kube.Store {
	t.Helper()
	s, err := kube.Open(cfg, opts)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestAPIServer runs everything that needs an API server against one:
// starting it costs seconds.
func TestAPIServer(t *testing.T) {
	c := startCluster(t)
	t.Run("Conformance", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) store.Store {
			s := open(t, c.Config, kube.Options{})
			empty(t, s)
			return s
		},
			// The API server's watch history lives in its watch cache,
			// which starts anew at the current version when the server
			// restarts.
			storetest.WithExpiry(func(t *testing.T) {
				c.StopAPIServer(t)
				c.StartAPIServer(t)
			}),
		)
	})
	t.Run("WatchResumes", func(t *testing.T) { testWatchResumes(t, c) })
	t.Run("TooLarge", func(t *testing.T) { testTooLarge(t, c) })
	t.Run("OneFieldManager", func(t *testing.T) { testOneFieldManager(t, c) })
	t.Run("ListPages", func(t *testing.T) { testListPages(t, c) })
	t.Run("ListContinueExpired", func(t *testing.T) { testListContinueExpired(t, c) })
	// Last: it deletes the Runtime CRD.
	t.Run("NotServed", func(t *testing.T) { testNotServed(t, c) })
}

// testNotServed checks that a kind whose CRD the API server does not serve
// (as while a restarted server installs its CRD paths) is unavailable, not
// a missing object.
func testNotServed(t *testing.T, c *kubetest.Cluster) {
	s := open(t, c.Config, kube.Options{})
	ctx := context.Background()
	c.Kubectl(t, "delete", "crd", "runtimes.stoke.dev", "--wait")
	_, err := s.Runtimes().Get(ctx, "default", "pool")
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "runtime default/pool") {
		t.Fatalf("get of a kind the API server does not serve: %v, want ErrUnavailable naming runtime default/pool", err)
	}
	_, err = s.Runs().Get(ctx, "default", "missing")
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("get of a missing run: %v, want ErrNotFound", err)
	}
}

// empty deletes every object of every kind the suite left behind, finalizers
// first, so that each test starts with an empty store as the suite
// expects of NewStore.
func empty(t *testing.T, s store.Store) {
	t.Helper()
	ctx := context.Background()
	emptyKind(ctx, t, s.Runs())
	emptyKind(ctx, t, s.Runtimes())
	emptyKind(ctx, t, s.Functions())
	emptyKind(ctx, t, s.WorkflowRuns())
	emptyKind(ctx, t, s.Workflows())
}

func emptyKind[T store.Object](ctx context.Context, t *testing.T, r store.Resource[T]) {
	t.Helper()
	items, _, err := r.List(ctx, store.ListOptions{})
	if err != nil {
		t.Fatalf("empty the store: %v", err)
	}
	for _, obj := range items {
		ns, name := obj.GetNamespace(), obj.GetName()
		err := store.RetryOnConflict(func() error {
			cur, err := r.Get(ctx, ns, name)
			if err != nil || len(cur.GetFinalizers()) == 0 {
				return err
			}
			cur.SetFinalizers(nil)
			_, err = r.Update(ctx, cur)
			return err
		})
		if err == nil {
			err = r.Delete(ctx, ns, name, store.DeleteOptions{})
		}
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("empty the store: %v", err)
		}
	}
	if items, _, err = r.List(ctx, store.ListOptions{}); err != nil || len(items) != 0 {
		t.Fatalf("the store still holds %d objects after emptying it (%v)", len(items), err)
	}
}

// The Kubernetes store's resourceVersions are opaque: it offers no order
// (store.VersionOrder), so nothing compares them as numbers.
func TestVersionsAreOpaque(t *testing.T) {
	s := open(t, &rest.Config{Host: "https://127.0.0.1:1"}, kube.Options{})
	if _, ok := s.Runs().(store.VersionOrder); ok {
		t.Error("the Kubernetes store's Runs offer an order of resourceVersions")
	}
	if _, ok := s.Runtimes().(store.VersionOrder); ok {
		t.Error("the Kubernetes store's Runtimes offer an order of resourceVersions")
	}
}

// TestUnreachable checks that a store whose API server does not answer
// fails with ErrUnavailable, naming the object.
func TestUnreachable(t *testing.T) {
	s := open(t, &rest.Config{Host: "https://127.0.0.1:1"}, kube.Options{})
	_, err := s.Runs().Get(context.Background(), "default", "somewhere")
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "run default/somewhere") {
		t.Fatalf("get from an unreachable API server: %v, want ErrUnavailable naming run default/somewhere", err)
	}
	_, err = s.Runs().Watch(context.Background(), store.WatchOptions{})
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("watch an unreachable API server: %v, want ErrUnavailable", err)
	}
}

// testWatchResumes checks that a watch the API server ends (here at its
// timeoutSeconds) goes on from where it was, without a gap or an Error
// event.
func testWatchResumes(t *testing.T, c *kubetest.Cluster) {
	resumed := make(chan struct{}, 16)
	log := slog.New(&signalHandler{msg: "kube store: the API server ended a watch, resuming", ch: resumed})
	s := open(t, c.Config, kube.Options{WatchTimeout: time.Second, Logger: log})
	ctx := context.Background()
	w, err := s.Runs().Watch(ctx, store.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var want []string
	for i := range 3 {
		r := &v1alpha1.Run{Spec: v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"true"}}}}}
		r.Namespace, r.GenerateName = "default", "resume-"
		created, err := s.Runs().Create(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, created.Name)
		if i < 2 {
			<-resumed // the API server ended the watch and the store resumed it
		}
	}
	for _, name := range want {
		ev := <-w.Events()
		if ev.Type != store.Added || ev.Object.Name != name {
			t.Fatalf("event %s %v (err %v), want ADDED %s", ev.Type, ev.Object, ev.Err, name)
		}
	}
}

// testTooLarge checks that an object over the API server's request limit
// is refused as ErrTooLarge and named.
func testTooLarge(t *testing.T, c *kubetest.Cluster) {
	s := open(t, c.Config, kube.Options{})
	r := &v1alpha1.Run{Spec: v1alpha1.RunSpec{
		Runtime: "bash",
		Mode:    v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Entrypoint: "main.sh"}},
		Source:  &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "main.sh", Text: strings.Repeat("x", 4<<20)}},
	}}
	r.Namespace, r.Name = "default", "huge"
	_, err := s.Runs().Create(context.Background(), r)
	if !errors.Is(err, errdefs.ErrTooLarge) || !strings.Contains(err.Error(), "run default/huge") {
		t.Fatalf("create of a 4 MiB Run: %v, want ErrTooLarge naming run default/huge", err)
	}
}

// testOneFieldManager checks that the scheduler's and runtimed's writes,
// made through stores with their own user agents, leave one managedFields
// entry for the object and one for its status, both the store's field
// manager's; and says what one manager per component would cost.
func testOneFieldManager(t *testing.T, c *kubetest.Cluster) {
	shared, sharedSize := writeWithManagers(t, c, "", "")
	if len(shared) != 2 || shared[0].Manager != kube.DefaultFieldManager || shared[1].Manager != kube.DefaultFieldManager || shared[0].Subresource == shared[1].Subresource {
		t.Fatalf("managedFields %+v, want one entry of %q for the object and one for its status", shared, kube.DefaultFieldManager)
	}
	apart, apartSize := writeWithManagers(t, c, "stoke-controller", "stoke-runtimed")
	if len(apart) != 3 {
		t.Fatalf("managedFields with a manager per component: %+v, want 3 entries", apart)
	}
	t.Logf("a Succeeded Run with its managedFields: %d bytes of JSON with one field manager, %d with one per component", sharedSize, apartSize)
}

type managedEntry struct{ Manager, Operation, Subresource string }

// writeWithManagers makes a task Run's writes as the controller (create,
// Scheduled) and runtimed (Running, Succeeded) make them, through stores
// with their own user agents and the field managers given, and returns
// the Run's managedFields and the size of its JSON.
func writeWithManagers(t *testing.T, c *kubetest.Cluster, controllerFM, runtimedFM string) ([]managedEntry, int) {
	ctx := context.Background()
	controller := open(t, c.Config, kube.Options{UserAgent: "stoke-controller", FieldManager: controllerFM})
	runtimed := open(t, c.Config, kube.Options{UserAgent: "stoke-runtimed/pod-1", FieldManager: runtimedFM})
	r, err := controller.Runs().Create(ctx, storetest.BenchRun("managers-"))
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range []*kube.Store{controller, runtimed, runtimed} {
		r.Status.Phase = []v1alpha1.Phase{v1alpha1.PhaseScheduled, v1alpha1.PhaseRunning, v1alpha1.PhaseSucceeded}[i]
		if r, err = s.Runs().UpdateStatus(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	var raw struct {
		Metadata struct {
			ManagedFields []managedEntry `json:"managedFields"`
		} `json:"metadata"`
	}
	body := c.Kubectl(t, "get", "run", "-n", r.Namespace, r.Name, "-o", "json", "--show-managed-fields")
	if err := json.Unmarshal([]byte(body), &raw); err != nil {
		t.Fatal(err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, []byte(body)); err != nil {
		t.Fatal(err)
	}
	return raw.Metadata.ManagedFields, compact.Len()
}

// signalHandler is a slog.Handler that signals each record with one
// message.
type signalHandler struct {
	msg string
	ch  chan struct{}
	mu  sync.Mutex
}

func (h *signalHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *signalHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.mu.Lock()
		defer h.mu.Unlock()
		select {
		case h.ch <- struct{}{}:
		default:
		}
	}
	return nil
}

func (h *signalHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *signalHandler) WithGroup(string) slog.Handler      { return h }
