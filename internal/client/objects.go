package client

import (
	"context"
	"net/http"
	"net/url"
	"strings"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
)

// DefaultNamespace is the namespace of an object that names none.
const DefaultNamespace = "default"

// ListOptions narrow a list or a watch.
type ListOptions struct {
	// LabelSelector is a Kubernetes label selector ("team=a,tier!=x").
	LabelSelector string
	// Phases keeps Runs in these phases only (Runs only).
	Phases []v1alpha1.Phase
	// ResourceVersion starts a watch after this version (from a list);
	// empty starts it with an ADDED event for every existing object.
	ResourceVersion string
}

func (o ListOptions) query(watch bool) url.Values {
	q := url.Values{}
	if o.LabelSelector != "" {
		q.Set("labelSelector", o.LabelSelector)
	}
	if len(o.Phases) > 0 {
		ps := make([]string, len(o.Phases))
		for i, p := range o.Phases {
			ps[i] = string(p)
		}
		q.Set("phase", strings.Join(ps, ","))
	}
	if watch {
		q.Set("watch", "true")
		if o.ResourceVersion != "" {
			q.Set("resourceVersion", o.ResourceVersion)
		}
	}
	return q
}

func namespaceOf(ns string) string {
	if ns == "" {
		return DefaultNamespace
	}
	return ns
}

// collection is the path of the objects of a kind ("runs", "runtimes")
// in ns, or in every namespace when ns is empty.
func collection(ns, kind string) []string {
	if ns == "" {
		return []string{"v1", kind}
	}
	return []string{"v1", "namespaces", ns, kind}
}

func runPath(ns, name string, rest ...string) []string {
	return append([]string{"v1", "namespaces", namespaceOf(ns), "runs", name}, rest...)
}

// dataplanePath is the path of a Run's invoke (uid given), exec or logs
// route: the gateway's own, or the aggregated API's, whose subresource
// follows the Run's name (and is "log"), where the API server's
// authorization reads it.
func (c *Client) dataplanePath(ns, name, route, uid string) []string {
	if !c.aggregated {
		if route == "invoke" {
			return runPath(ns, name, uid, route)
		}
		return runPath(ns, name, route)
	}
	if route == "logs" {
		route = "log"
	}
	p := []string{"apis", "gateway.stoke.dev", "v1alpha1", "namespaces", namespaceOf(ns), "runs", name, route}
	if uid != "" {
		p = append(p, uid)
	}
	return p
}

func runtimePath(ns, name string) []string {
	return []string{"v1", "namespaces", namespaceOf(ns), "runtimes", name}
}

// CreateRun creates run in its namespace (default when empty). A Run with
// metadata.generateName and no name gets a generated name. It returns the
// Run as stored; creating a name that exists wraps errdefs.ErrAlreadyExists.
func (c *Client) CreateRun(ctx context.Context, run *v1alpha1.Run) (*v1alpha1.Run, error) {
	if run == nil {
		return nil, errdefs.InvalidArgument("run", "must not be nil")
	}
	b, err := jsonBody(run)
	if err != nil {
		return nil, err
	}
	out := new(v1alpha1.Run)
	err = c.do(ctx, request{method: http.MethodPost, url: c.url(nil, collection(namespaceOf(run.Namespace), "runs")...), body: b}, MaxObject, out)
	return out, err
}

// GetRun returns one Run.
func (c *Client) GetRun(ctx context.Context, ns, name string) (*v1alpha1.Run, error) {
	out := new(v1alpha1.Run)
	err := c.do(ctx, request{method: http.MethodGet, url: c.url(nil, runPath(ns, name)...)}, MaxObject, out)
	return out, err
}

// ListRuns lists the Runs in ns, or in every namespace when ns is empty.
func (c *Client) ListRuns(ctx context.Context, ns string, opts ListOptions) (*v1alpha1.RunList, error) {
	out := new(v1alpha1.RunList)
	err := c.do(ctx, request{method: http.MethodGet, url: c.url(opts.query(false), collection(ns, "runs")...)}, MaxList, out)
	return out, err
}

// WatchRuns watches the Runs in ns, or in every namespace when ns is empty.
// The caller closes the watch.
func (c *Client) WatchRuns(ctx context.Context, ns string, opts ListOptions) (*Watch[v1alpha1.Run], error) {
	return watch[v1alpha1.Run](ctx, c, c.url(opts.query(true), collection(ns, "runs")...))
}

// CancelRun sets the Run's spec.cancelRequested and returns the Run.
func (c *Client) CancelRun(ctx context.Context, ns, name string) (*v1alpha1.Run, error) {
	out := new(v1alpha1.Run)
	err := c.do(ctx, request{method: http.MethodPost, url: c.url(nil, runPath(ns, name, "cancel")...)}, MaxObject, out)
	return out, err
}

// DeleteRun deletes a Run (a function drains and unregisters first; the
// object goes when that is done) and returns it as it was.
func (c *Client) DeleteRun(ctx context.Context, ns, name string) (*v1alpha1.Run, error) {
	out := new(v1alpha1.Run)
	err := c.do(ctx, request{method: http.MethodDelete, url: c.url(nil, runPath(ns, name)...)}, MaxObject, out)
	return out, err
}

// ApplyRuntime creates or updates a Runtime in its namespace (default when
// empty) and returns it as stored.
func (c *Client) ApplyRuntime(ctx context.Context, rt *v1alpha1.Runtime) (*v1alpha1.Runtime, error) {
	if rt == nil {
		return nil, errdefs.InvalidArgument("runtime", "must not be nil")
	}
	if rt.Name == "" {
		return nil, errdefs.InvalidArgument("metadata.name", "must not be empty")
	}
	b, err := jsonBody(rt)
	if err != nil {
		return nil, err
	}
	out := new(v1alpha1.Runtime)
	err = c.do(ctx, request{method: http.MethodPut, url: c.url(nil, runtimePath(rt.Namespace, rt.Name)...), body: b}, MaxObject, out)
	return out, err
}

// GetRuntime returns one Runtime.
func (c *Client) GetRuntime(ctx context.Context, ns, name string) (*v1alpha1.Runtime, error) {
	out := new(v1alpha1.Runtime)
	err := c.do(ctx, request{method: http.MethodGet, url: c.url(nil, runtimePath(ns, name)...)}, MaxObject, out)
	return out, err
}

// ListRuntimes lists the Runtimes in ns, or in every namespace when ns is
// empty.
func (c *Client) ListRuntimes(ctx context.Context, ns string, opts ListOptions) (*v1alpha1.RuntimeList, error) {
	out := new(v1alpha1.RuntimeList)
	err := c.do(ctx, request{method: http.MethodGet, url: c.url(opts.query(false), collection(ns, "runtimes")...)}, MaxList, out)
	return out, err
}

// WatchRuntimes watches the Runtimes in ns, or in every namespace when ns
// is empty. The caller closes the watch.
func (c *Client) WatchRuntimes(ctx context.Context, ns string, opts ListOptions) (*Watch[v1alpha1.Runtime], error) {
	return watch[v1alpha1.Runtime](ctx, c, c.url(opts.query(true), collection(ns, "runtimes")...))
}

// DeleteRuntime deletes a Runtime (its pods stop) and returns it as it was.
func (c *Client) DeleteRuntime(ctx context.Context, ns, name string) (*v1alpha1.Runtime, error) {
	out := new(v1alpha1.Runtime)
	err := c.do(ctx, request{method: http.MethodDelete, url: c.url(nil, runtimePath(ns, name)...)}, MaxObject, out)
	return out, err
}

func functionPath(ns, name string) []string {
	return []string{"v1", "namespaces", namespaceOf(ns), "functions", name}
}

// CreateFunction creates a Function in its namespace (default when empty)
// and returns it as stored.
func (c *Client) CreateFunction(ctx context.Context, fn *v1alpha1.Function) (*v1alpha1.Function, error) {
	if fn == nil {
		return nil, errdefs.InvalidArgument("function", "must not be nil")
	}
	b, err := jsonBody(fn)
	if err != nil {
		return nil, err
	}
	out := new(v1alpha1.Function)
	err = c.do(ctx, request{method: http.MethodPost, url: c.url(nil, collection(namespaceOf(fn.Namespace), "functions")...), body: b}, MaxObject, out)
	return out, err
}

// ApplyFunction creates a Function or replaces its spec and labels, and
// returns it as stored.
func (c *Client) ApplyFunction(ctx context.Context, fn *v1alpha1.Function) (*v1alpha1.Function, error) {
	if fn == nil || fn.Name == "" {
		return nil, errdefs.InvalidArgument("metadata.name", "must not be empty")
	}
	b, err := jsonBody(fn)
	if err != nil {
		return nil, err
	}
	out := new(v1alpha1.Function)
	err = c.do(ctx, request{method: http.MethodPut, url: c.url(nil, functionPath(fn.Namespace, fn.Name)...), body: b}, MaxObject, out)
	return out, err
}

// GetFunction returns one Function.
func (c *Client) GetFunction(ctx context.Context, ns, name string) (*v1alpha1.Function, error) {
	out := new(v1alpha1.Function)
	err := c.do(ctx, request{method: http.MethodGet, url: c.url(nil, functionPath(ns, name)...)}, MaxObject, out)
	return out, err
}

// ListFunctions lists the Functions in ns, or in every namespace when ns
// is empty.
func (c *Client) ListFunctions(ctx context.Context, ns string, opts ListOptions) (*v1alpha1.FunctionList, error) {
	out := new(v1alpha1.FunctionList)
	err := c.do(ctx, request{method: http.MethodGet, url: c.url(opts.query(false), collection(ns, "functions")...)}, MaxList, out)
	return out, err
}

// WatchFunctions watches the Functions in ns, or in every namespace when
// ns is empty. The caller closes the watch.
func (c *Client) WatchFunctions(ctx context.Context, ns string, opts ListOptions) (*Watch[v1alpha1.Function], error) {
	return watch[v1alpha1.Function](ctx, c, c.url(opts.query(true), collection(ns, "functions")...))
}

// DeleteFunction deletes a Function (its replicas drain and go) and
// returns it as it was.
func (c *Client) DeleteFunction(ctx context.Context, ns, name string) (*v1alpha1.Function, error) {
	out := new(v1alpha1.Function)
	err := c.do(ctx, request{method: http.MethodDelete, url: c.url(nil, functionPath(ns, name)...)}, MaxObject, out)
	return out, err
}
