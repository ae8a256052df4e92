package client

import (
	"context"
	"net/http"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
)

func workflowRunPath(ns, name string, sub ...string) []string {
	return append([]string{"v1", "namespaces", namespaceOf(ns), "workflowruns", name}, sub...)
}

func workflowPath(ns, name string) []string {
	return []string{"v1", "namespaces", namespaceOf(ns), "workflows", name}
}

// CreateWorkflowRun creates a WorkflowRun in its namespace (default when
// empty) and returns it as stored.
func (c *Client) CreateWorkflowRun(ctx context.Context, w *v1alpha1.WorkflowRun) (*v1alpha1.WorkflowRun, error) {
	if w == nil {
		return nil, errdefs.InvalidArgument("workflowrun", "must not be nil")
	}
	b, err := jsonBody(w)
	if err != nil {
		return nil, err
	}
	out := new(v1alpha1.WorkflowRun)
	err = c.do(ctx, request{method: http.MethodPost, url: c.url(nil, collection(namespaceOf(w.Namespace), "workflowruns")...), body: b}, MaxObject, out)
	return out, err
}

// GetWorkflowRun returns one WorkflowRun.
func (c *Client) GetWorkflowRun(ctx context.Context, ns, name string) (*v1alpha1.WorkflowRun, error) {
	out := new(v1alpha1.WorkflowRun)
	err := c.do(ctx, request{method: http.MethodGet, url: c.url(nil, workflowRunPath(ns, name)...)}, MaxObject, out)
	return out, err
}

// ListWorkflowRuns lists the WorkflowRuns in ns, or in every namespace
// when ns is empty.
func (c *Client) ListWorkflowRuns(ctx context.Context, ns string, opts ListOptions) (*v1alpha1.WorkflowRunList, error) {
	out := new(v1alpha1.WorkflowRunList)
	err := c.do(ctx, request{method: http.MethodGet, url: c.url(opts.query(false), collection(ns, "workflowruns")...)}, MaxList, out)
	return out, err
}

// WatchWorkflowRuns watches the WorkflowRuns in ns, or in every namespace
// when ns is empty. The caller closes the watch.
func (c *Client) WatchWorkflowRuns(ctx context.Context, ns string, opts ListOptions) (*Watch[v1alpha1.WorkflowRun], error) {
	return watch[v1alpha1.WorkflowRun](ctx, c, c.url(opts.query(true), collection(ns, "workflowruns")...))
}

// CancelWorkflowRun asks for a WorkflowRun's cancel and returns it.
func (c *Client) CancelWorkflowRun(ctx context.Context, ns, name string) (*v1alpha1.WorkflowRun, error) {
	out := new(v1alpha1.WorkflowRun)
	err := c.do(ctx, request{method: http.MethodPost, url: c.url(nil, workflowRunPath(ns, name, "cancel")...)}, MaxObject, out)
	return out, err
}

// DeleteWorkflowRun deletes a WorkflowRun and returns it as it was.
func (c *Client) DeleteWorkflowRun(ctx context.Context, ns, name string) (*v1alpha1.WorkflowRun, error) {
	out := new(v1alpha1.WorkflowRun)
	err := c.do(ctx, request{method: http.MethodDelete, url: c.url(nil, workflowRunPath(ns, name)...)}, MaxObject, out)
	return out, err
}

// ApplyWorkflow creates a Workflow or replaces its spec and labels, and
// returns it as stored.
func (c *Client) ApplyWorkflow(ctx context.Context, w *v1alpha1.Workflow) (*v1alpha1.Workflow, error) {
	if w == nil || w.Name == "" {
		return nil, errdefs.InvalidArgument("metadata.name", "must not be empty")
	}
	b, err := jsonBody(w)
	if err != nil {
		return nil, err
	}
	out := new(v1alpha1.Workflow)
	err = c.do(ctx, request{method: http.MethodPut, url: c.url(nil, workflowPath(w.Namespace, w.Name)...), body: b}, MaxObject, out)
	return out, err
}

// GetWorkflow returns one Workflow.
func (c *Client) GetWorkflow(ctx context.Context, ns, name string) (*v1alpha1.Workflow, error) {
	out := new(v1alpha1.Workflow)
	err := c.do(ctx, request{method: http.MethodGet, url: c.url(nil, workflowPath(ns, name)...)}, MaxObject, out)
	return out, err
}

// ListWorkflows lists the Workflows in ns, or in every namespace when ns
// is empty.
func (c *Client) ListWorkflows(ctx context.Context, ns string, opts ListOptions) (*v1alpha1.WorkflowList, error) {
	out := new(v1alpha1.WorkflowList)
	err := c.do(ctx, request{method: http.MethodGet, url: c.url(opts.query(false), collection(ns, "workflows")...)}, MaxList, out)
	return out, err
}

// WatchWorkflows watches the Workflows in ns, or in every namespace when
// ns is empty. The caller closes the watch.
func (c *Client) WatchWorkflows(ctx context.Context, ns string, opts ListOptions) (*Watch[v1alpha1.Workflow], error) {
	return watch[v1alpha1.Workflow](ctx, c, c.url(opts.query(true), collection(ns, "workflows")...))
}

// DeleteWorkflow deletes a Workflow and returns it as it was.
func (c *Client) DeleteWorkflow(ctx context.Context, ns, name string) (*v1alpha1.Workflow, error) {
	out := new(v1alpha1.Workflow)
	err := c.do(ctx, request{method: http.MethodDelete, url: c.url(nil, workflowPath(ns, name)...)}, MaxObject, out)
	return out, err
}
