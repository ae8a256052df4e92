package kube_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/kubetest"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/kube"
)

// listRequests records the Run list requests a store sends, and calls
// after (if set) once each answer has arrived, before the store reads it.
type listRequests struct {
	mu    sync.Mutex
	reqs  []*http.Request
	after func(n int)
}

func (l *listRequests) wrap(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(req *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(req)
			if req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/runs") && req.URL.Query().Get("watch") == "" {
				l.mu.Lock()
				l.reqs = append(l.reqs, req)
				n, after := len(l.reqs), l.after
				l.mu.Unlock()
				if after != nil {
					after(n)
				}
			}
			return resp, err
		})
	}
	return cfg
}

func (l *listRequests) queries() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.reqs {
		q := r.URL.Query()
		out = append(out, "limit="+q.Get("limit")+" continue="+map[bool]string{true: "yes", false: "no"}[q.Get("continue") != ""])
	}
	return out
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// createRuns creates n Runs named prefix-0… in namespace ns, labelled
// with the prefix.
func createRuns(t *testing.T, runs store.Resource[*v1alpha1.Run], ns, prefix string, n int) []string {
	t.Helper()
	var names []string
	for i := range n {
		r := &v1alpha1.Run{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: prefix + "-" + string(rune('a'+i)), Labels: map[string]string{"set": prefix}},
			Spec: v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"true"}}}}}
		created, err := runs.Create(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, created.Name)
	}
	return names
}

// testListPages checks that List reads in pages of Options.ListPage (at
// most bounds.KubeListPage) through continue tokens, and returns every
// matching object and the first page's resourceVersion, from which a
// watch sees the writes after the List.
func testListPages(t *testing.T, c *kubetest.Cluster) {
	admin := open(t, c.Config, kube.Options{})
	want := createRuns(t, admin.Runs(), "default", "paged", 5)
	var reqs listRequests
	s := open(t, reqs.wrap(c.Config), kube.Options{ListPage: 2})
	ctx := context.Background()
	items, rv, err := s.Runs().List(ctx, store.ListOptions{Namespace: "default", LabelSelector: labels.SelectorFromSet(labels.Set{"set": "paged"})})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, it := range items {
		got = append(got, it.Name)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("listed %v, want %v", got, want)
	}
	if q := strings.Join(reqs.queries(), ", "); q != "limit=2 continue=no, limit=2 continue=yes, limit=2 continue=yes" {
		t.Fatalf("list requests: %s, want three pages of 2", q)
	}
	w, err := s.Runs().Watch(ctx, store.WatchOptions{Namespace: "default", ResourceVersion: rv})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	after := createRuns(t, admin.Runs(), "default", "after", 1)
	if ev := <-w.Events(); ev.Type != store.Added || ev.Object == nil || ev.Object.Name != after[0] {
		t.Fatalf("the watch from the list's version: %s %v (err %v), want ADDED %s", ev.Type, ev.Object, ev.Err, after[0])
	}

	// The limit is bounds.KubeListPage whatever Options say.
	var big listRequests
	s = open(t, big.wrap(c.Config), kube.Options{ListPage: 1 << 20})
	if _, _, err := s.Runs().List(ctx, store.ListOptions{Namespace: "default"}); err != nil {
		t.Fatal(err)
	}
	if q := big.queries(); len(q) != 1 || q[0] != "limit=500 continue=no" {
		t.Fatalf("list requests %v, want one of limit=500 (bounds.KubeListPage)", q)
	}
}

// testListContinueExpired checks that a continue token the API server no
// longer honours fails the List with errdefs.ErrExpired, so that the
// caller lists again, and that a List started afresh succeeds. Between
// two pages etcd is compacted past the list's version and the API server
// restarts, as when another replica serves the next page: its watch cache
// holds no snapshot of that version, etcd no longer has it, and the
// answer is 410.
func testListContinueExpired(t *testing.T, c *kubetest.Cluster) {
	admin := open(t, c.Config, kube.Options{})
	createRuns(t, admin.Runs(), "default", "expiring", 3)
	reqs := listRequests{}
	reqs.after = func(n int) {
		if n != 1 {
			return
		}
		// A write, so that compaction passes the first page's version.
		createRuns(t, admin.Runs(), "default", "compacted", 1)
		c.CompactEtcd(t)
		c.StopAPIServer(t)
		c.StartAPIServer(t)
	}
	s := open(t, reqs.wrap(c.Config), kube.Options{ListPage: 2})
	_, _, err := s.Runs().List(context.Background(), store.ListOptions{Namespace: "default"})
	if !errors.Is(err, errdefs.ErrExpired) || !strings.Contains(err.Error(), "runs in default") {
		t.Fatalf("a List whose continue token expired: %v (requests %v), want ErrExpired naming runs in default", err, reqs.queries())
	}
	reqs.mu.Lock()
	reqs.after = nil
	reqs.mu.Unlock()
	if _, _, err := s.Runs().List(context.Background(), store.ListOptions{Namespace: "default"}); err != nil {
		t.Fatalf("listing again: %v", err)
	}
}
