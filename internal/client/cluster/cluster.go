// Package cluster is the stoke CLI's backend for Kubernetes mode: the
// client.API seam over a kubeconfig context. Runs and Runtimes are read
// and written through the API server with internal/store/kube (the store
// the controller and runtimed use, so the CLI sees what they see);
// invoke, exec and logs go to Stoke's gateway through the API server, as
// the aggregated API gateway.stoke.dev/v1alpha1, with the kubeconfig's own
// credentials (client certificates, tokens, exec credential plugins): the
// API server authenticates and authorizes the caller and proxies to the
// gateway with the caller's identity, so the CLI works wherever kubectl
// does, with no port-forward and no second credential. Config.Gateway
// sends them to a gateway URL instead, with the kubeconfig's bearer
// credentials.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/gorilla/websocket"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/artifact"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/store/kube"
)

// AggregatedPath is where the API server serves Stoke's gateway as an
// aggregated API (the APIService v1alpha1.gateway.stoke.dev the chart
// installs): invoke, exec and logs follow it.
const AggregatedPath = "/apis/gateway.stoke.dev/v1alpha1"

// Config configures New.
type Config struct {
	// REST is the kubeconfig context's.
	REST *rest.Config
	// Context is the context's name, for Target.
	Context string
	// Gateway, when set, is the gateway's URL, called directly with the
	// kubeconfig's bearer credentials (tokens, exec plugins) instead of
	// through the API server.
	Gateway string
	// CACertFile is a PEM file of CAs for Gateway's certificate.
	CACertFile string
	// Why says how this backend was chosen, for Target.
	Why string
}

// Client is client.API on a cluster. Close releases it.
type Client struct {
	store  store.Store
	gw     *client.Client
	target client.Target
}

var _ client.API = (*Client)(nil)

// New returns the backend of cfg's context. It sends nothing yet.
func New(cfg Config) (*Client, error) {
	if cfg.REST == nil {
		return nil, errdefs.InvalidArgument("kubeconfig", "no REST config")
	}
	st, err := kube.Open(cfg.REST, kube.Options{QPS: -1, UserAgent: "stoke-cli", FieldManager: "stoke-cli"})
	if err != nil {
		return nil, err
	}
	gw, gwURL, err := gatewayClient(cfg)
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	return &Client{store: st, gw: gw, target: client.Target{
		Mode: client.Cluster, Server: cfg.REST.Host, Context: cfg.Context, Gateway: gwURL, Why: cfg.Why,
	}}, nil
}

// Close ends the watches and releases the connections.
func (c *Client) Close() error { return c.store.Close() }

// Target implements client.API.
func (c *Client) Target() client.Target { return c.target }

// gatewayClient is the HTTP client of the gateway's routes: the API
// server's aggregated API with the kubeconfig's transport, or cfg.Gateway
// with its bearer credentials and cfg.CACertFile. The string is the
// gateway's URL as the CLI reaches it, for Target.
func gatewayClient(cfg Config) (*client.Client, string, error) {
	rc := rest.CopyConfig(cfg.REST)
	server, shown := cfg.Gateway, cfg.Gateway
	aggregated := server == ""
	if aggregated {
		base, _, err := rest.DefaultServerUrlFor(rc)
		if err != nil {
			return nil, "", fmt.Errorf("kubeconfig: the API server's URL: %w", err)
		}
		server = strings.TrimSuffix(base.String(), "/")
		shown = server + AggregatedPath
	} else {
		// The gateway is not the API server: its own CA, and no client
		// certificate of the API server's.
		rc.Host = server
		rc.TLSClientConfig = rest.TLSClientConfig{CAFile: cfg.CACertFile}
	}
	// Every call is bounded by its context; watches and followed logs
	// are long.
	rc.Timeout = 0
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig: %w", err)
	}
	up, err := upgrader(rc)
	if err != nil {
		return nil, "", err
	}
	gw, err := client.New(client.Config{Server: server, HTTPClient: hc, Upgrade: up, Aggregated: aggregated})
	if err != nil {
		return nil, "", err
	}
	if !aggregated {
		shown = gw.Server()
	}
	return gw, shown, nil
}

// upgrader opens exec's WebSocket with the kubeconfig's TLS settings and
// credentials (client-go's transport wrappers: bearer tokens, exec
// plugins, impersonation), as kubectl exec does.
func upgrader(rc *rest.Config) (func(context.Context, string, http.Header, []string) (*websocket.Conn, *http.Response, error), error) {
	tc, err := rc.TransportConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	tlsConfig, err := transport.TLSConfigFor(tc)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return func(ctx context.Context, u string, h http.Header, subprotocols []string) (*websocket.Conn, *http.Response, error) {
		d := &wsDialer{dialer: websocket.Dialer{
			Subprotocols:    subprotocols,
			TLSClientConfig: tlsConfig,
			Proxy:           http.ProxyFromEnvironment,
			ReadBufferSize:  bounds.ExecFrame + 1,
			WriteBufferSize: bounds.ExecFrame + 1,
		}}
		rt, err := transport.HTTPWrappersForConfig(tc, d)
		if err != nil {
			return nil, nil, err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, nil, err
		}
		req.Header = h.Clone()
		resp, err := rt.RoundTrip(req)
		if err != nil {
			return nil, nil, err
		}
		if d.conn == nil {
			return nil, resp, errors.New("the upgrade was refused")
		}
		return d.conn, resp, nil
	}, nil
}

// wsDialer is the innermost round tripper of an exec: it dials the
// WebSocket with the headers the wrappers above it added. A refused
// upgrade is its answer, for the caller to read as an error.
type wsDialer struct {
	dialer websocket.Dialer
	conn   *websocket.Conn
}

func (d *wsDialer) RoundTrip(req *http.Request) (*http.Response, error) {
	u := *req.URL
	switch u.Scheme {
	case "https":
		u.Scheme = "wss"
	case "http":
		u.Scheme = "ws"
	}
	conn, resp, err := d.dialer.DialContext(req.Context(), u.String(), req.Header)
	if err != nil {
		if resp != nil {
			return resp, nil
		}
		return nil, err
	}
	d.conn = conn
	return resp, nil
}

// Logs implements client.API through the gateway.
func (c *Client) Logs(ctx context.Context, ns, name string, follow bool) (*client.LogStream, error) {
	return c.gw.Logs(ctx, ns, name, follow)
}

// Invoke implements client.API through the gateway.
func (c *Client) Invoke(ctx context.Context, ns, name, uid string, input []byte, opts client.InvokeOptions) (*client.InvokeResult, error) {
	return c.gw.Invoke(ctx, ns, name, uid, input, opts)
}

// InvokeFunction implements client.API through the gateway.
func (c *Client) InvokeFunction(ctx context.Context, ns, name string, input []byte, opts client.InvokeOptions) (*client.InvokeResult, error) {
	return c.gw.InvokeFunction(ctx, ns, name, input, opts)
}

// Exec implements client.API through the gateway.
func (c *Client) Exec() exec.Executor { return c.gw.Exec() }

// ListArtifacts implements client.API through the gateway.
func (c *Client) ListArtifacts(ctx context.Context, ns, workflowRun string) ([]artifact.Artifact, error) {
	return c.gw.ListArtifacts(ctx, ns, workflowRun)
}

// OpenArtifact implements client.API through the gateway.
func (c *Client) OpenArtifact(ctx context.Context, ns, workflowRun, name string) (artifact.Artifact, io.ReadCloser, error) {
	return c.gw.OpenArtifact(ctx, ns, workflowRun, name)
}

// InvokeURL implements client.API: the Run's invoke URL as the CLI
// reaches it (the aggregated API's, or the path of its endpoint at
// Config.Gateway).
func (c *Client) InvokeURL(run *v1alpha1.Run) string {
	ep := run.Status.Endpoint
	if i := strings.Index(ep, "/v1/namespaces/"); i > 0 {
		ep = ep[i:]
	}
	r := run.DeepCopy()
	r.Status.Endpoint = ep
	return c.gw.InvokeURL(r)
}

func namespaceOf(ns string) string {
	if ns == "" {
		return client.DefaultNamespace
	}
	return ns
}

// CreateRun implements client.API. As stoke up does, it refuses a Run
// whose Runtime does not exist, which the API server cannot check.
func (c *Client) CreateRun(ctx context.Context, run *v1alpha1.Run) (*v1alpha1.Run, error) {
	if run == nil {
		return nil, errdefs.InvalidArgument("run", "must not be nil")
	}
	run = run.DeepCopy()
	run.Namespace = namespaceOf(run.Namespace)
	if _, err := c.store.Runtimes().Get(ctx, run.Namespace, run.Spec.Runtime); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, errdefs.InvalidArgument("spec.runtime", "no Runtime %q in namespace %q", run.Spec.Runtime, run.Namespace)
		}
		return nil, err
	}
	return c.store.Runs().Create(ctx, run)
}

// GetRun implements client.API.
func (c *Client) GetRun(ctx context.Context, ns, name string) (*v1alpha1.Run, error) {
	return c.store.Runs().Get(ctx, namespaceOf(ns), name)
}

// ListRuns implements client.API.
func (c *Client) ListRuns(ctx context.Context, ns string, opts client.ListOptions) (*v1alpha1.RunList, error) {
	items, rv, err := list(ctx, c.store.Runs(), ns, opts)
	if err != nil {
		return nil, err
	}
	out := &v1alpha1.RunList{Items: make([]v1alpha1.Run, len(items))}
	out.APIVersion, out.Kind, out.ResourceVersion = v1alpha1.GroupVersion.String(), "RunList", rv
	for i, r := range items {
		out.Items[i] = *r
	}
	return out, nil
}

// WatchRuns implements client.API.
func (c *Client) WatchRuns(ctx context.Context, ns string, opts client.ListOptions) (*client.Watch[v1alpha1.Run], error) {
	return watch(ctx, c.store.Runs(), ns, opts, func(r *v1alpha1.Run) *v1alpha1.Run { return r })
}

// CancelRun implements client.API as stoke up does: spec.cancelRequested,
// unless the Run has ended or asked already.
func (c *Client) CancelRun(ctx context.Context, ns, name string) (*v1alpha1.Run, error) {
	return store.RequestCancel(ctx, c.store.Runs(), namespaceOf(ns), name)
}

// DeleteRun implements client.API: the Run read, then deleted with its
// UID as a precondition.
func (c *Client) DeleteRun(ctx context.Context, ns, name string) (*v1alpha1.Run, error) {
	return deleteObject(ctx, c.store.Runs(), namespaceOf(ns), name)
}

// ApplyRuntime implements client.API as stoke up does: created, or its
// spec and labels updated; the API server validates (the CRD's schema
// and rules).
func (c *Client) ApplyRuntime(ctx context.Context, rt *v1alpha1.Runtime) (*v1alpha1.Runtime, error) {
	if rt == nil || rt.Name == "" {
		return nil, errdefs.InvalidArgument("metadata.name", "must not be empty")
	}
	rt = rt.DeepCopy()
	rt.Namespace = namespaceOf(rt.Namespace)
	return store.CreateOrUpdate(ctx, c.store.Runtimes(), rt, func(cur *v1alpha1.Runtime) (*v1alpha1.Runtime, error) {
		next := cur.DeepCopy()
		next.Spec = rt.Spec
		next.Labels = rt.Labels
		return next, nil
	})
}

// GetRuntime implements client.API.
func (c *Client) GetRuntime(ctx context.Context, ns, name string) (*v1alpha1.Runtime, error) {
	return c.store.Runtimes().Get(ctx, namespaceOf(ns), name)
}

// ListRuntimes implements client.API.
func (c *Client) ListRuntimes(ctx context.Context, ns string, opts client.ListOptions) (*v1alpha1.RuntimeList, error) {
	items, rv, err := list(ctx, c.store.Runtimes(), ns, opts)
	if err != nil {
		return nil, err
	}
	out := &v1alpha1.RuntimeList{Items: make([]v1alpha1.Runtime, len(items))}
	out.APIVersion, out.Kind, out.ResourceVersion = v1alpha1.GroupVersion.String(), "RuntimeList", rv
	for i, r := range items {
		out.Items[i] = *r
	}
	return out, nil
}

// WatchRuntimes implements client.API.
func (c *Client) WatchRuntimes(ctx context.Context, ns string, opts client.ListOptions) (*client.Watch[v1alpha1.Runtime], error) {
	return watch(ctx, c.store.Runtimes(), ns, opts, func(r *v1alpha1.Runtime) *v1alpha1.Runtime { return r })
}

// DeleteRuntime implements client.API.
func (c *Client) DeleteRuntime(ctx context.Context, ns, name string) (*v1alpha1.Runtime, error) {
	return deleteObject(ctx, c.store.Runtimes(), namespaceOf(ns), name)
}

// CreateFunction implements client.API; the API server validates (the
// CRD's schema and rules) and defaults.
func (c *Client) CreateFunction(ctx context.Context, fn *v1alpha1.Function) (*v1alpha1.Function, error) {
	if fn == nil {
		return nil, errdefs.InvalidArgument("function", "must not be nil")
	}
	fn = fn.DeepCopy()
	fn.Namespace = namespaceOf(fn.Namespace)
	return c.store.Functions().Create(ctx, fn)
}

// ApplyFunction implements client.API as stoke up does: created, or its
// spec and labels replaced (an unset spec.replicas keeps the stored one,
// the autoscaler's or kubectl scale's).
func (c *Client) ApplyFunction(ctx context.Context, fn *v1alpha1.Function) (*v1alpha1.Function, error) {
	if fn == nil || fn.Name == "" {
		return nil, errdefs.InvalidArgument("metadata.name", "must not be empty")
	}
	fn = fn.DeepCopy()
	fn.Namespace = namespaceOf(fn.Namespace)
	return store.CreateOrUpdate(ctx, c.store.Functions(), fn, func(cur *v1alpha1.Function) (*v1alpha1.Function, error) {
		next := cur.DeepCopy()
		next.Spec = fn.Spec
		if next.Spec.Replicas == nil {
			next.Spec.Replicas = cur.Spec.Replicas
		}
		next.Labels = fn.Labels
		return next, nil
	})
}

// GetFunction implements client.API.
func (c *Client) GetFunction(ctx context.Context, ns, name string) (*v1alpha1.Function, error) {
	return c.store.Functions().Get(ctx, namespaceOf(ns), name)
}

// ListFunctions implements client.API.
func (c *Client) ListFunctions(ctx context.Context, ns string, opts client.ListOptions) (*v1alpha1.FunctionList, error) {
	items, rv, err := list(ctx, c.store.Functions(), ns, opts)
	if err != nil {
		return nil, err
	}
	out := &v1alpha1.FunctionList{Items: make([]v1alpha1.Function, len(items))}
	out.APIVersion, out.Kind, out.ResourceVersion = v1alpha1.GroupVersion.String(), "FunctionList", rv
	for i, f := range items {
		out.Items[i] = *f
	}
	return out, nil
}

// WatchFunctions implements client.API.
func (c *Client) WatchFunctions(ctx context.Context, ns string, opts client.ListOptions) (*client.Watch[v1alpha1.Function], error) {
	return watch(ctx, c.store.Functions(), ns, opts, func(f *v1alpha1.Function) *v1alpha1.Function { return f })
}

// DeleteFunction implements client.API.
func (c *Client) DeleteFunction(ctx context.Context, ns, name string) (*v1alpha1.Function, error) {
	return deleteObject(ctx, c.store.Functions(), namespaceOf(ns), name)
}

func deleteObject[T store.Object](ctx context.Context, r store.Resource[T], ns, name string) (T, error) {
	obj, err := r.Get(ctx, ns, name)
	if err != nil {
		return obj, err
	}
	err = r.Delete(ctx, ns, name, store.DeleteOptions{Preconditions: store.Preconditions{UID: string(obj.GetUID())}})
	return obj, err
}

func list[T store.Object](ctx context.Context, r store.Resource[T], ns string, opts client.ListOptions) ([]T, string, error) {
	sel, err := selector(opts.LabelSelector)
	if err != nil {
		return nil, "", err
	}
	return r.List(ctx, store.ListOptions{Namespace: ns, LabelSelector: sel, Phases: opts.Phases})
}

func selector(s string) (labels.Selector, error) {
	if s == "" {
		return nil, nil
	}
	sel, err := labels.Parse(s)
	if err != nil {
		return nil, errdefs.InvalidArgument("labelSelector", "%q: %v", s, err)
	}
	return sel, nil
}

// watch is a client.Watch over the store's: from opts.ResourceVersion, or
// else a list whose objects come first as ADDED events, then the changes
// after it. The label selector is applied here (the store watches whole
// namespaces).
func watch[V any, T store.Object](ctx context.Context, r store.Resource[T], ns string, opts client.ListOptions, conv func(T) *V) (*client.Watch[V], error) {
	sel, err := selector(opts.LabelSelector)
	if err != nil {
		return nil, err
	}
	var first []T
	rv := opts.ResourceVersion
	if rv == "" {
		if first, rv, err = r.List(ctx, store.ListOptions{Namespace: ns, LabelSelector: sel}); err != nil {
			return nil, err
		}
	}
	w, err := r.Watch(ctx, store.WatchOptions{Namespace: ns, ResourceVersion: rv})
	if err != nil {
		return nil, err
	}
	next := func() (client.Event[V], error) {
		if len(first) > 0 {
			obj := first[0]
			first = first[1:]
			return client.Event[V]{Type: client.Added, Object: conv(obj)}, nil
		}
		for ev := range w.Events() {
			if ev.Type == store.Error {
				return client.Event[V]{}, ev.Err
			}
			if sel != nil && !sel.Matches(labels.Set(ev.Object.GetLabels())) {
				continue
			}
			return client.Event[V]{Type: client.EventType(ev.Type), Object: conv(ev.Object)}, nil
		}
		if err := ctx.Err(); err != nil {
			return client.Event[V]{}, err
		}
		return client.Event[V]{}, io.EOF
	}
	return client.NewWatch(next, func() error { w.Stop(); return nil }), nil
}
