package standalone

import (
	"context"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/validation"
)

// workflowGetter reads the Workflows a WorkflowRun or Workflow calls, for
// validation.
func (s *Standalone) workflowGetter() validation.WorkflowGetter {
	return func(ctx context.Context, namespace, name string) (*v1alpha1.Workflow, error) {
		return s.store.Workflows().Get(ctx, namespace, name)
	}
}

// CreateWorkflowRun defaults and validates a WorkflowRun (the Workflows it
// calls included) and stores it; the workflow controller runs it. A
// refused one stores nothing.
func (s *Standalone) CreateWorkflowRun(ctx context.Context, w *v1alpha1.WorkflowRun) (*v1alpha1.WorkflowRun, error) {
	validation.SetWorkflowRunDefaults(w)
	if err := validation.ValidateWorkflowRun(ctx, w, s.workflowGetter()); err != nil {
		return nil, err
	}
	return s.store.WorkflowRuns().Create(ctx, w)
}

// GetWorkflowRun reads one WorkflowRun.
func (s *Standalone) GetWorkflowRun(ctx context.Context, namespace, name string) (*v1alpha1.WorkflowRun, error) {
	return s.store.WorkflowRuns().Get(ctx, namespace, name)
}

// ListWorkflowRuns lists WorkflowRuns.
func (s *Standalone) ListWorkflowRuns(ctx context.Context, opts store.ListOptions) ([]*v1alpha1.WorkflowRun, string, error) {
	return s.store.WorkflowRuns().List(ctx, opts)
}

// WatchWorkflowRuns watches WorkflowRuns from a resource version.
func (s *Standalone) WatchWorkflowRuns(ctx context.Context, opts store.WatchOptions) (store.Watcher[*v1alpha1.WorkflowRun], error) {
	return s.store.WorkflowRuns().Watch(ctx, opts)
}

// CancelWorkflowRun asks the workflow controller to cancel a WorkflowRun.
func (s *Standalone) CancelWorkflowRun(ctx context.Context, namespace, name string) (*v1alpha1.WorkflowRun, error) {
	return store.RequestWorkflowCancel(ctx, s.store.WorkflowRuns(), namespace, name)
}

// DeleteWorkflowRun deletes a WorkflowRun and returns it as it was.
func (s *Standalone) DeleteWorkflowRun(ctx context.Context, namespace, name string) (*v1alpha1.WorkflowRun, error) {
	return deleteByUID(ctx, s.store.WorkflowRuns(), namespace, name)
}

// ApplyWorkflow creates a Workflow or replaces its spec and labels. A
// running WorkflowRun keeps the snapshot it took when it started.
func (s *Standalone) ApplyWorkflow(ctx context.Context, w *v1alpha1.Workflow) (*v1alpha1.Workflow, error) {
	validation.SetWorkflowDefaults(w)
	if err := validation.ValidateWorkflow(ctx, w, s.workflowGetter()); err != nil {
		return nil, err
	}
	return store.CreateOrUpdate(ctx, s.store.Workflows(), w, func(cur *v1alpha1.Workflow) (*v1alpha1.Workflow, error) {
		next := cur.DeepCopy()
		next.Spec = w.Spec
		next.Labels = w.Labels
		return next, validation.ValidateWorkflowUpdate(ctx, cur, next, s.workflowGetter())
	})
}

// GetWorkflow reads one Workflow.
func (s *Standalone) GetWorkflow(ctx context.Context, namespace, name string) (*v1alpha1.Workflow, error) {
	return s.store.Workflows().Get(ctx, namespace, name)
}

// ListWorkflows lists Workflows.
func (s *Standalone) ListWorkflows(ctx context.Context, opts store.ListOptions) ([]*v1alpha1.Workflow, string, error) {
	return s.store.Workflows().List(ctx, opts)
}

// WatchWorkflows watches Workflows from a resource version.
func (s *Standalone) WatchWorkflows(ctx context.Context, opts store.WatchOptions) (store.Watcher[*v1alpha1.Workflow], error) {
	return s.store.Workflows().Watch(ctx, opts)
}

// DeleteWorkflow deletes a Workflow and returns it as it was; a running
// WorkflowRun that calls it keeps its snapshot.
func (s *Standalone) DeleteWorkflow(ctx context.Context, namespace, name string) (*v1alpha1.Workflow, error) {
	return deleteByUID(ctx, s.store.Workflows(), namespace, name)
}

// deleteByUID reads an object and deletes it with its UID as a
// precondition, so that a newer object of the name is never hit.
func deleteByUID[T store.Object](ctx context.Context, r store.Resource[T], namespace, name string) (T, error) {
	obj, err := r.Get(ctx, namespace, name)
	if err != nil {
		var zero T
		return zero, err
	}
	err = r.Delete(ctx, namespace, name, store.DeleteOptions{Preconditions: store.Preconditions{UID: string(obj.GetUID())}})
	return obj, err
}
