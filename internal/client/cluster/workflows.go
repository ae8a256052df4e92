package cluster

import (
	"context"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/validation"
)

// workflowGetter reads the Workflows a WorkflowRun or Workflow calls.
func (c *Client) workflowGetter() validation.WorkflowGetter {
	return func(ctx context.Context, namespace, name string) (*v1alpha1.Workflow, error) {
		return c.store.Workflows().Get(ctx, namespace, name)
	}
}

// CreateWorkflowRun implements client.API. The CLI validates as stoke up
// does (what the CRD's rules cannot say: cycles, expressions, calls), so
// that a bad WorkflowRun is refused at create in both modes; the API
// server validates what its schema and rules say.
func (c *Client) CreateWorkflowRun(ctx context.Context, w *v1alpha1.WorkflowRun) (*v1alpha1.WorkflowRun, error) {
	if w == nil {
		return nil, errdefs.InvalidArgument("workflowrun", "must not be nil")
	}
	w = w.DeepCopy()
	w.Namespace = namespaceOf(w.Namespace)
	validation.SetWorkflowRunDefaults(w)
	if err := validation.ValidateWorkflowRun(ctx, w, c.workflowGetter()); err != nil {
		return nil, err
	}
	return c.store.WorkflowRuns().Create(ctx, w)
}

// GetWorkflowRun implements client.API.
func (c *Client) GetWorkflowRun(ctx context.Context, ns, name string) (*v1alpha1.WorkflowRun, error) {
	return c.store.WorkflowRuns().Get(ctx, namespaceOf(ns), name)
}

// ListWorkflowRuns implements client.API.
func (c *Client) ListWorkflowRuns(ctx context.Context, ns string, opts client.ListOptions) (*v1alpha1.WorkflowRunList, error) {
	items, rv, err := list(ctx, c.store.WorkflowRuns(), ns, opts)
	if err != nil {
		return nil, err
	}
	out := &v1alpha1.WorkflowRunList{Items: make([]v1alpha1.WorkflowRun, len(items))}
	out.APIVersion, out.Kind, out.ResourceVersion = v1alpha1.GroupVersion.String(), "WorkflowRunList", rv
	for i, w := range items {
		out.Items[i] = *w
	}
	return out, nil
}

// WatchWorkflowRuns implements client.API.
func (c *Client) WatchWorkflowRuns(ctx context.Context, ns string, opts client.ListOptions) (*client.Watch[v1alpha1.WorkflowRun], error) {
	return watch(ctx, c.store.WorkflowRuns(), ns, opts, func(w *v1alpha1.WorkflowRun) *v1alpha1.WorkflowRun { return w })
}

// CancelWorkflowRun implements client.API.
func (c *Client) CancelWorkflowRun(ctx context.Context, ns, name string) (*v1alpha1.WorkflowRun, error) {
	return store.RequestWorkflowCancel(ctx, c.store.WorkflowRuns(), namespaceOf(ns), name)
}

// DeleteWorkflowRun implements client.API.
func (c *Client) DeleteWorkflowRun(ctx context.Context, ns, name string) (*v1alpha1.WorkflowRun, error) {
	return deleteObject(ctx, c.store.WorkflowRuns(), namespaceOf(ns), name)
}

// ApplyWorkflow implements client.API as stoke up does: validated, then
// created or its spec and labels replaced.
func (c *Client) ApplyWorkflow(ctx context.Context, w *v1alpha1.Workflow) (*v1alpha1.Workflow, error) {
	if w == nil || w.Name == "" {
		return nil, errdefs.InvalidArgument("metadata.name", "must not be empty")
	}
	w = w.DeepCopy()
	w.Namespace = namespaceOf(w.Namespace)
	validation.SetWorkflowDefaults(w)
	if err := validation.ValidateWorkflow(ctx, w, c.workflowGetter()); err != nil {
		return nil, err
	}
	return store.CreateOrUpdate(ctx, c.store.Workflows(), w, func(cur *v1alpha1.Workflow) (*v1alpha1.Workflow, error) {
		next := cur.DeepCopy()
		next.Spec = w.Spec
		next.Labels = w.Labels
		return next, nil
	})
}

// GetWorkflow implements client.API.
func (c *Client) GetWorkflow(ctx context.Context, ns, name string) (*v1alpha1.Workflow, error) {
	return c.store.Workflows().Get(ctx, namespaceOf(ns), name)
}

// ListWorkflows implements client.API.
func (c *Client) ListWorkflows(ctx context.Context, ns string, opts client.ListOptions) (*v1alpha1.WorkflowList, error) {
	items, rv, err := list(ctx, c.store.Workflows(), ns, opts)
	if err != nil {
		return nil, err
	}
	out := &v1alpha1.WorkflowList{Items: make([]v1alpha1.Workflow, len(items))}
	out.APIVersion, out.Kind, out.ResourceVersion = v1alpha1.GroupVersion.String(), "WorkflowList", rv
	for i, w := range items {
		out.Items[i] = *w
	}
	return out, nil
}

// WatchWorkflows implements client.API.
func (c *Client) WatchWorkflows(ctx context.Context, ns string, opts client.ListOptions) (*client.Watch[v1alpha1.Workflow], error) {
	return watch(ctx, c.store.Workflows(), ns, opts, func(w *v1alpha1.Workflow) *v1alpha1.Workflow { return w })
}

// DeleteWorkflow implements client.API.
func (c *Client) DeleteWorkflow(ctx context.Context, ns, name string) (*v1alpha1.Workflow, error) {
	return deleteObject(ctx, c.store.Workflows(), namespaceOf(ns), name)
}
