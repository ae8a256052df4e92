package kubegateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/yaml"

	"stoke.dev/stoke/deploy"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/gateway"
	"stoke.dev/stoke/internal/kubetest"
)

// reviewCounter counts the reviews the gateway's client sends.
type reviewCounter struct {
	next               http.RoundTripper
	tokenReviews, sars atomic.Int64
}

func (c *reviewCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	switch {
	case strings.HasSuffix(r.URL.Path, "/tokenreviews"):
		c.tokenReviews.Add(1)
	case strings.HasSuffix(r.URL.Path, "/subjectaccessreviews"):
		c.sars.Add(1)
	}
	return c.next.RoundTrip(r)
}

// authEnv is a real API server with deploy/'s user roles, a namespace and
// ServiceAccounts bound to them.
type authEnv struct {
	cluster *kubetest.Cluster
	admin   kubernetes.Interface
	count   *reviewCounter
	client  kubernetes.Interface // the gateway's, counted
	ns      string
}

func startAuthEnv(t *testing.T) *authEnv {
	c := kubetest.Start(t, kubetest.Options{})
	admin, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	e := &authEnv{cluster: c, admin: admin, ns: "team", count: &reviewCounter{}}
	gw := rest.CopyConfig(c.Config)
	gw.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { e.count.next = rt; return e.count }
	if e.client, err = kubernetes.NewForConfig(gw); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, cr := range userRoles(t) {
		if _, err := admin.RbacV1().ClusterRoles().Create(ctx, cr, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// userRoles are the ClusterRoles of deploy/controller/user-roles.yaml.
func userRoles(t *testing.T) []*rbacv1.ClusterRole {
	data, err := deploy.FS.ReadFile("controller/user-roles.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var out []*rbacv1.ClusterRole
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		cr := &rbacv1.ClusterRole{}
		if err := yaml.UnmarshalStrict(doc, cr); err != nil {
			t.Fatal(err)
		}
		out = append(out, cr)
	}
}

// user makes a ServiceAccount bound to role in the namespace and returns
// its token.
func (e *authEnv) user(t *testing.T, name, role string) string {
	ctx := context.Background()
	if _, err := e.admin.CoreV1().ServiceAccounts(e.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.RbacV1().RoleBindings(e.ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: e.ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := e.admin.CoreV1().ServiceAccounts(e.ns).CreateToken(ctx, name, &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

func request(token string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	return r
}

func access(ns, verb, sub string) gateway.Access {
	return gateway.Access{Verb: verb, Resource: "runs", Subresource: sub, Namespace: ns, Name: "fn"}
}

// category names an Authorize answer for messages.
func category(err error) string {
	for _, c := range []error{errdefs.ErrUnauthenticated, errdefs.ErrPermissionDenied, errdefs.ErrInvalidArgument, errdefs.ErrUnavailable} {
		if errors.Is(err, c) {
			return c.Error()
		}
	}
	if err == nil {
		return "allowed"
	}
	return err.Error()
}

// The rules, on a real API server with deploy/'s stoke-edit and
// stoke-view: an editor invokes, execs and reads logs in its namespace
// only; a viewer reads logs and is 403 on invoke and exec; an unknown
// token is 401; a removed RoleBinding takes effect once the decision's
// 10 s are up (the cache's clock is moved, not waited for); a token of
// 1 MiB is refused without a review; concurrent misses for one token make
// one review of each kind.
func TestAuthorizerOnARealAPIServer(t *testing.T) {
	e := startAuthEnv(t)
	editor, viewer := e.user(t, "editor", "stoke-edit"), e.user(t, "viewer", "stoke-view")
	clock := clocktesting.NewFakeClock(time.Now())
	a := NewAuthorizer(AuthConfig{Client: e.client, Clock: clock})

	for _, c := range []struct {
		name   string
		token  string
		access gateway.Access
		want   error
	}{
		{"editor invokes", editor, access(e.ns, "create", "invoke"), nil},
		{"editor execs", editor, access(e.ns, "create", "exec"), nil},
		{"editor reads logs", editor, access(e.ns, "get", "log"), nil},
		{"editor elsewhere", editor, access("default", "create", "invoke"), errdefs.ErrPermissionDenied},
		{"viewer reads logs", viewer, access(e.ns, "get", "log"), nil},
		{"viewer invokes", viewer, access(e.ns, "create", "invoke"), errdefs.ErrPermissionDenied},
		{"viewer execs", viewer, access(e.ns, "create", "exec"), errdefs.ErrPermissionDenied},
		{"unknown token", "not-a-token", access(e.ns, "get", "log"), errdefs.ErrUnauthenticated},
		{"no token", "", access(e.ns, "get", "log"), errdefs.ErrUnauthenticated},
	} {
		err := a.Authorize(request(c.token), c.access)
		if (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("%s: %s (%v), want %s", c.name, category(err), err, category(c.want))
		}
	}

	// Cached: the same questions again ask nothing.
	trs, sars := e.count.tokenReviews.Load(), e.count.sars.Load()
	for range 3 {
		if err := a.Authorize(request(editor), access(e.ns, "create", "invoke")); err != nil {
			t.Fatal(err)
		}
		if err := a.Authorize(request(viewer), access(e.ns, "create", "exec")); !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Fatal(err)
		}
	}
	if d1, d2 := e.count.tokenReviews.Load()-trs, e.count.sars.Load()-sars; d1 != 0 || d2 != 0 {
		t.Errorf("cached decisions made %d TokenReviews and %d SubjectAccessReviews", d1, d2)
	}
	if hits := testutil.ToFloat64(a.lookups.WithLabelValues("access", "hit")); hits < 6 {
		t.Errorf("access cache hits %v, want ≥ 6", hits)
	}

	// A token of 1 MiB: refused, nobody asked.
	trs, sars = e.count.tokenReviews.Load(), e.count.sars.Load()
	err := a.Authorize(request(strings.Repeat("a", 1<<20)), access(e.ns, "get", "log"))
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "at most") {
		t.Errorf("1 MiB token: %v", err)
	}
	if e.count.tokenReviews.Load() != trs || e.count.sars.Load() != sars {
		t.Error("a 1 MiB token was sent for review")
	}

	// Concurrent misses for one new token: one review of each kind.
	burst := e.user(t, "burst", "stoke-edit")
	trs, sars = e.count.tokenReviews.Load(), e.count.sars.Load()
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, 32)
	for i := range errs {
		wg.Go(func() {
			<-start
			errs[i] = a.Authorize(request(burst), access(e.ns, "create", "invoke"))
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("burst %d: %v", i, err)
		}
	}
	if d1, d2 := e.count.tokenReviews.Load()-trs, e.count.sars.Load()-sars; d1 != 1 || d2 != 1 {
		t.Errorf("32 concurrent first calls of one token made %d TokenReviews and %d SubjectAccessReviews, want 1 and 1", d1, d2)
	}

	// A removed RoleBinding: still allowed while the decision is kept,
	// refused once its 10 s are up.
	ctx := context.Background()
	if err := e.admin.RbacV1().RoleBindings(e.ns).Delete(ctx, "editor", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.awaitDenied(t, "system:serviceaccount:"+e.ns+":editor")
	if err := a.Authorize(request(editor), access(e.ns, "create", "invoke")); err != nil {
		t.Errorf("within the decision's TTL: %v", err)
	}
	clock.Step(MaxDecisionTTL + time.Millisecond)
	if err := a.Authorize(request(editor), access(e.ns, "create", "invoke")); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("10 s after the RoleBinding went: %s (%v), want permission denied", category(err), err)
	}
}

// A caller allowed on a subresource in the namespace by a rule without
// resourceNames is allowed on every name after one review (a new
// Function's first call waits for none); one allowed by resourceNames is
// allowed on those names and refused on the others, each name reviewed.
func TestAuthorizerOneReviewForEveryName(t *testing.T) {
	e := startAuthEnv(t)
	editor := e.user(t, "editor", "stoke-edit")
	ctx := context.Background()
	if _, err := e.admin.RbacV1().Roles(e.ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "invoke-one"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"stoke.dev"}, Resources: []string{"functions/invoke"},
			Verbs: []string{"create"}, ResourceNames: []string{"one"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.CoreV1().ServiceAccounts(e.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "one"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := e.admin.CoreV1().ServiceAccounts(e.ns).CreateToken(ctx, "one", &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	one := tr.Status.Token
	if _, err := e.admin.RbacV1().RoleBindings(e.ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "one-invokes"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "invoke-one"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "one", Namespace: e.ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.awaitAllowed(t, "system:serviceaccount:"+e.ns+":one", "one")
	a := NewAuthorizer(AuthConfig{Client: e.client})
	invoke := func(token, name string) error {
		return a.Authorize(request(token), gateway.Access{Verb: "create", Resource: "functions", Subresource: "invoke", Namespace: e.ns, Name: name})
	}

	sars := e.count.sars.Load()
	for i := range 5 {
		if err := invoke(editor, fmt.Sprintf("fn%d", i)); err != nil {
			t.Fatalf("editor invokes fn%d: %v", i, err)
		}
	}
	if n := e.count.sars.Load() - sars; n != 1 {
		t.Errorf("the editor's first calls of 5 Functions made %d SubjectAccessReviews, want 1", n)
	}
	if err := invoke(editor, "fn0"); err != nil {
		t.Fatal(err)
	}
	if err := a.Authorize(request(editor), gateway.Access{Verb: "create", Resource: "functions", Subresource: "invoke", Namespace: "default", Name: "fn0"}); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("editor in another namespace: %s (%v), want permission denied", category(err), err)
	}

	if err := invoke(one, "one"); err != nil {
		t.Errorf("a caller allowed on one name invokes it: %v", err)
	}
	for _, name := range []string{"two", "fn0"} {
		if err := invoke(one, name); !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("a caller allowed on one name invokes %s: %s (%v), want permission denied", name, category(err), err)
		}
	}
}

// awaitAllowed waits until the API server's RBAC lets user invoke the
// Function name in the namespace.
func (e *authEnv) awaitAllowed(t *testing.T, user, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		sar, err := e.admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
			User: user, ResourceAttributes: &authzv1.ResourceAttributes{Namespace: e.ns, Verb: "create", Group: "stoke.dev",
				Resource: "functions", Subresource: "invoke", Name: name},
		}}, metav1.CreateOptions{})
		if err == nil && sar.Status.Allowed {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the API server does not allow %s to invoke %s yet: %v", user, name, err)
		case <-tick.C:
		}
	}
}

// awaitDenied waits until the API server's RBAC (an informer of its own)
// no longer lets user invoke in the namespace.
func (e *authEnv) awaitDenied(t *testing.T, user string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		sar, err := e.admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
			User: user, ResourceAttributes: &authzv1.ResourceAttributes{Namespace: e.ns, Verb: "create", Group: "stoke.dev", Resource: "runs", Subresource: "invoke"},
		}}, metav1.CreateOptions{})
		if err == nil && !sar.Status.Allowed {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the API server still allows %s: %v", user, err)
		case <-tick.C:
		}
	}
}

// --token-audiences: a token must be for one of the gateway's audiences.
// The API server answers a TokenReview that asks for audiences with those
// the token is for; by default (none asked) only its own audience passes.
func TestAuthorizerChecksTokenAudiences(t *testing.T) {
	e := startAuthEnv(t)
	e.user(t, "aud-editor", "stoke-edit")
	token := func(audiences ...string) string {
		t.Helper()
		tr, err := e.admin.CoreV1().ServiceAccounts(e.ns).CreateToken(context.Background(), "aud-editor",
			&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{Audiences: audiences}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	apiServers, gateways := token(), token("stoke-gateway")
	def := NewAuthorizer(AuthConfig{Client: e.client})
	own := NewAuthorizer(AuthConfig{Client: e.client, Audiences: []string{"stoke-gateway", "other"}})
	invoke := access(e.ns, "create", "invoke")
	for _, c := range []struct {
		name  string
		a     *Authorizer
		token string
		want  error
	}{
		{"default audiences, the API server's token", def, apiServers, nil},
		{"default audiences, a token for the gateway", def, gateways, errdefs.ErrUnauthenticated},
		{"the gateway's audiences, a token for the gateway", own, gateways, nil},
		{"the gateway's audiences, the API server's token", own, apiServers, errdefs.ErrUnauthenticated},
	} {
		err := c.a.Authorize(request(c.token), invoke)
		if (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("%s: %s (%v), want %s", c.name, category(err), err, category(c.want))
		}
	}
}
