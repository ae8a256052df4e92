package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/httpapi"
)

// InvokeOptions tune one invocation.
type InvokeOptions struct {
	// InvocationID is sent as X-Stoke-Invocation-ID (≤ 128 bytes); empty
	// lets the server generate one.
	InvocationID string
	// Timeout bounds the invocation on the server; 0 is the Runtime's
	// default. It is sent in whole milliseconds, rounded up.
	Timeout time.Duration
	// ContentType of the input; empty means application/json.
	ContentType string
}

// InvokeResult is a function's answer.
type InvokeResult struct {
	StatusCode   int
	Body         []byte
	ContentType  string
	InvocationID string
	// Outputs are the invocation's outputs (X-Stoke-Outputs), if any.
	Outputs map[string]string
}

// Invoke calls a Ready function Run once, identified by namespace, name
// and UID (the Run's status.endpoint is the same URL). A handler failure is
// an *APIError wrapping an *errdefs.FunctionError; the call is never
// retried.
func (c *Client) Invoke(ctx context.Context, ns, name, uid string, input []byte, opts InvokeOptions) (*InvokeResult, error) {
	if uid == "" {
		return nil, errdefs.InvalidArgument("uid", "must not be empty")
	}
	return c.invoke(ctx, c.url(nil, c.dataplanePath(ns, name, "invoke", uid)...), input, opts)
}

// InvokeFunction calls a Function once through its stable URL: one of
// its replicas answers, after a wait in its queue when none is idle. A
// Function that does not exist is NotFound.
func (c *Client) InvokeFunction(ctx context.Context, ns, name string, input []byte, opts InvokeOptions) (*InvokeResult, error) {
	if c.aggregated {
		return c.invoke(ctx, c.url(nil, "apis", "gateway.stoke.dev", "v1alpha1", "namespaces", namespaceOf(ns), "functions", name, "invoke"), input, opts)
	}
	return c.invoke(ctx, c.url(nil, "v1", "namespaces", namespaceOf(ns), "functions", name, "invoke"), input, opts)
}

// invoke is both invoke routes' call: one POST, never retried.
func (c *Client) invoke(ctx context.Context, u *url.URL, input []byte, opts InvokeOptions) (*InvokeResult, error) {
	if len(input) > bounds.InvokeBody {
		return nil, errdefs.Errorf(errdefs.ErrTooLarge, "the input is %d bytes, at most %d allowed", len(input), bounds.InvokeBody)
	}
	if len(opts.InvocationID) > bounds.InvocationID {
		return nil, errdefs.InvalidArgument("invocation ID", "is %d bytes, at most %d allowed", len(opts.InvocationID), bounds.InvocationID)
	}
	if opts.Timeout < 0 {
		return nil, errdefs.InvalidArgument("timeout", "must not be negative")
	}
	h := http.Header{}
	if opts.InvocationID != "" {
		h.Set(httpapi.HeaderInvocationID, opts.InvocationID)
	}
	if opts.Timeout > 0 {
		ms := (opts.Timeout + time.Millisecond - 1) / time.Millisecond
		h.Set(httpapi.HeaderTimeout, strconv.FormatInt(int64(ms), 10))
	}
	ct := opts.ContentType
	if ct == "" {
		ct = "application/json"
	}
	if input == nil {
		input = []byte{}
	}
	resp, err := c.send(ctx, request{method: http.MethodPost, url: u, body: input, contentType: ct, header: h})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	res := &InvokeResult{
		StatusCode: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"),
		InvocationID: resp.Header.Get(httpapi.HeaderInvocationID),
	}
	// A function's output is bounded like its input.
	if res.Body, err = readBounded(resp.Body, bounds.InvokeBody); err != nil {
		return res, fmt.Errorf("invoke %s: reading the output: %w", u.Path, err)
	}
	if o := resp.Header.Get(httpapi.HeaderOutputs); o != "" {
		if err := json.Unmarshal([]byte(o), &res.Outputs); err != nil {
			return res, fmt.Errorf("invoke %s: decoding %s: %w", u.Path, httpapi.HeaderOutputs, err)
		}
	}
	return res, nil
}

// InvokeURL implements API: a Run's status.endpoint as an absolute URL,
// a path resolved against the server's URL (its path prefix kept).
func (c *Client) InvokeURL(run *v1alpha1.Run) string {
	if c.aggregated {
		return c.url(nil, c.dataplanePath(run.Namespace, run.Name, "invoke", string(run.UID))...).String()
	}
	ep := run.Status.Endpoint
	u, err := url.Parse(ep)
	if err != nil || u.IsAbs() {
		return ep
	}
	base := *c.base
	if strings.HasPrefix(ep, "/") {
		base.Path = strings.TrimSuffix(base.Path, "/") + u.Path
		base.RawQuery = u.RawQuery
		return base.String()
	}
	return base.ResolveReference(u).String()
}
