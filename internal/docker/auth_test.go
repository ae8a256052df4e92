package docker

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/gateway"
	"stoke.dev/stoke/internal/store"
)

// Every route says what it needs, so that none is served unauthorised
// by the Kubernetes gateway, and every need is a route's.
func TestEveryRouteIsAuthorised(t *testing.T) {
	routes := New(Config{Backend: noRuns{}}).handlers()
	for pattern := range routes {
		if _, ok := needs[pattern]; !ok {
			t.Errorf("route %s has no entry in needs (auth.go)", pattern)
		}
	}
	for pattern := range needs {
		if _, ok := routes[pattern]; !ok {
			t.Errorf("needs has %s, which is no route", pattern)
		}
	}
}

// noRuns is a control plane with no Runs, which fails the test if
// anything reaches it that would act on one.
type noRuns struct{ t *testing.T }

func (b noRuns) fail(what string) error {
	b.t.Errorf("%s reached the control plane", what)
	return errdefs.Errorf(errdefs.ErrInternal, "%s reached the control plane", what)
}
func (b noRuns) CreateRun(context.Context, *v1alpha1.Run) (*v1alpha1.Run, error) {
	return nil, b.fail("CreateRun")
}
func (b noRuns) GetRun(context.Context, string, string) (*v1alpha1.Run, error) {
	return nil, b.fail("GetRun")
}
func (b noRuns) CancelRun(context.Context, string, string) (*v1alpha1.Run, error) {
	return nil, b.fail("CancelRun")
}
func (b noRuns) DeleteRun(context.Context, string, string) (*v1alpha1.Run, error) {
	return nil, b.fail("DeleteRun")
}
func (b noRuns) WatchRuns(context.Context, store.WatchOptions) (store.Watcher[*v1alpha1.Run], error) {
	return nil, b.fail("WatchRuns")
}
func (b noRuns) ListRuns(context.Context, store.ListOptions) ([]*v1alpha1.Run, string, error) {
	return nil, "", b.fail("ListRuns")
}
func (b noRuns) ReleaseRun(context.Context, string, string) (*v1alpha1.Run, error) {
	return nil, b.fail("ReleaseRun")
}
func (noRuns) CachedRun(string, string) (*v1alpha1.Run, bool) { return nil, false }
func (noRuns) CachedRuns(string) []*v1alpha1.Run              { return nil }
func (b noRuns) ExecRoute(string, string) (exec.Executor, string, error) {
	return nil, "", b.fail("ExecRoute")
}

// refuseAll records what it was asked and refuses: no credential (401)
// for Access{}, forbidden (403) for the rest.
type refuseAll struct {
	mu    sync.Mutex
	asked []gateway.Access
}

func (a *refuseAll) Authorize(_ *http.Request, acc gateway.Access) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asked = append(a.asked, acc)
	if acc == (gateway.Access{}) {
		return errdefs.Errorf(errdefs.ErrUnauthenticated, "no credential")
	}
	return errdefs.Errorf(errdefs.ErrPermissionDenied, "forbidden")
}

// A refused request gets Docker's error shape with 401 or 403, and
// nothing of it reaches the control plane; the namespace is the path's
// (or the default), and each route asks for its own rule on the Run the
// path names.
func TestRefusedRequestsReachNothing(t *testing.T) {
	for _, tc := range []struct {
		method, path string
		status       int
		want         gateway.Access
	}{
		{"HEAD", "/_ping", 401, gateway.Access{}},
		// The default namespace is served from the start.
		{"GET", "/v1.41/containers/json", 403, gateway.Access{Verb: "list", Resource: "runs", Namespace: "default"}},
		// A namespace nobody asked for yet: may the caller read its Runs?
		{"GET", "/namespaces/team/v1.41/containers/json", 403, gateway.Access{Verb: "get", Resource: "runs", Namespace: "team"}},
		{"POST", "/namespaces/team/v1.41/containers/create?name=web", 403, gateway.Access{Verb: "get", Resource: "runs", Namespace: "team"}},
		{"GET", "/namespaces/Bad_NS/v1.41/containers/json", 400, gateway.Access{}},
	} {
		t.Run(tc.method+tc.path, func(t *testing.T) {
			auth := &refuseAll{}
			n := NewNamespaces(Config{Backend: noRuns{t: t}, Auth: auth})
			w := httptest.NewRecorder()
			n.ServeHTTP(w, httptest.NewRequest(tc.method, tc.path, strings.NewReader(`{"Image":"bash","Cmd":["true"]}`)))
			if w.Code != tc.status {
				t.Fatalf("status %d %s, want %d", w.Code, w.Body, tc.status)
			}
			if strings.HasSuffix(tc.path, "/_ping") && w.Header().Get("API-Version") != APIVersion {
				t.Errorf("a refused ping names no API version: %v", w.Header())
			}
			if tc.method != "HEAD" {
				var body struct{ Message string }
				if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || body.Message == "" {
					t.Errorf("body %q: not Docker's error shape", w.Body)
				}
			}
			if tc.status == 400 {
				return
			}
			if len(auth.asked) == 0 || auth.asked[len(auth.asked)-1] != tc.want {
				t.Errorf("asked %+v, want last %+v", auth.asked, tc.want)
			}
		})
	}
}

// Once a namespace is served, each route asks its own rule: create names
// the container's Run to be; a container the caller may not see is
// refused as one that does not exist would be (403, not 404).
func TestRoutesAskForTheirRule(t *testing.T) {
	auth := &allowNamespace{}
	n := NewNamespaces(Config{Backend: noRuns{t: t}, Auth: auth})
	for _, tc := range []struct {
		method, path string
		want         []gateway.Access
	}{
		{"POST", "/namespaces/team/v1.57/containers/create?name=web", []gateway.Access{{Verb: "create", Resource: "runs", Namespace: "team", Name: "web"}}},
		{"POST", "/namespaces/team/containers/web/kill", []gateway.Access{{Verb: "update", Resource: "runs", Namespace: "team", Name: "web"}}},
		{"GET", "/namespaces/team/containers/abc/archive?path=x", []gateway.Access{{Verb: "create", Resource: "runs", Subresource: "exec", Namespace: "team", Name: "abc"}}},
		{"POST", "/namespaces/team/exec/nope/start", []gateway.Access{{Verb: "create", Resource: "runs", Subresource: "exec", Namespace: "team"}}},
		{"GET", "/namespaces/team/containers/web/logs", []gateway.Access{{Verb: "get", Resource: "runs", Subresource: "log", Namespace: "team", Name: "web"}}},
	} {
		auth.asked = nil
		w := httptest.NewRecorder()
		n.ServeHTTP(w, httptest.NewRequest(tc.method, tc.path, strings.NewReader(`{"Image":"bash","Cmd":["true"]}`)))
		if w.Code != http.StatusForbidden {
			t.Errorf("%s %s: status %d %s, want 403", tc.method, tc.path, w.Code, w.Body)
		}
		got := auth.asked
		if len(got) > 0 && got[0] == (gateway.Access{Verb: "get", Resource: "runs", Namespace: "team"}) {
			got = got[1:] // the namespace's first request
		}
		if len(got) != len(tc.want) || got[0] != tc.want[0] {
			t.Errorf("%s %s: asked %+v, want %+v", tc.method, tc.path, got, tc.want)
		}
	}
}

// allowNamespace allows reading the namespace's Runs and nothing else.
type allowNamespace struct{ asked []gateway.Access }

func (a *allowNamespace) Authorize(_ *http.Request, acc gateway.Access) error {
	a.asked = append(a.asked, acc)
	if acc.Verb == "get" && acc.Name == "" && acc.Subresource == "" {
		return nil
	}
	return errdefs.Errorf(errdefs.ErrPermissionDenied, "forbidden")
}

// withRuntimes is noRuns with Runtimes in memory.
type withRuntimes struct {
	noRuns
	rts []*v1alpha1.Runtime
}

func (b withRuntimes) CachedRuntime(ns, name string) (*v1alpha1.Runtime, bool) {
	for _, rt := range b.rts {
		if rt.Namespace == ns && rt.Name == name {
			return rt, true
		}
	}
	return nil, false
}

func (b withRuntimes) CachedRuntimes(ns string) []*v1alpha1.Runtime {
	var out []*v1alpha1.Runtime
	for _, rt := range b.rts {
		if rt.Namespace == ns {
			out = append(out, rt)
		}
	}
	return out
}

// A Runtime that names an image (spec.lambda.image, spec.template.image)
// is selected by it before the table; other images go by the table; a
// Runtime of another namespace selects nothing here.
func TestAnImageSelectsTheRuntimeThatRunsIt(t *testing.T) {
	rt := func(ns, name string, spec v1alpha1.RuntimeSpec) *v1alpha1.Runtime {
		r := &v1alpha1.Runtime{Spec: spec}
		r.Namespace, r.Name = ns, name
		return r
	}
	s := New(Config{Backend: withRuntimes{rts: []*v1alpha1.Runtime{
		rt("default", "lam", v1alpha1.RuntimeSpec{Server: "lambda", Lambda: &v1alpha1.LambdaSpec{Runtime: "python", Image: "123.dkr.ecr.example/team/py:1"}}),
		rt("default", "kpy", v1alpha1.RuntimeSpec{Server: "bash", Template: &v1alpha1.RuntimeTemplate{Image: "docker.io/library/python:3.12"}}),
		rt("other", "elsewhere", v1alpha1.RuntimeSpec{Server: "bash", Template: &v1alpha1.RuntimeTemplate{Image: "team/tool:2"}}),
	}}})
	for _, tc := range []struct{ ref, runtime, cmd string }{
		{"123.dkr.ecr.example/team/py:1", "lam", "python3"},
		{"python:3.12", "kpy", "bash"},
		{"python:3.11", "python", "python3"}, // the table's
		{"team/tool:2", "", ""},
	} {
		rule, _, err := s.resolve(tc.ref)
		switch {
		case tc.runtime == "" && errdefs.HTTPStatus(err) != http.StatusNotFound:
			t.Errorf("%s: %+v %v, want No such image", tc.ref, rule, err)
		case tc.runtime != "" && (err != nil || rule.Runtime != tc.runtime || rule.Cmd[0] != tc.cmd):
			t.Errorf("%s: %+v %v, want Runtime %s running %s", tc.ref, rule, err, tc.runtime, tc.cmd)
		}
	}
}
