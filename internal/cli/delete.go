package cli

import (
	"context"
	"errors"
	"fmt"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/cli/manifest"
	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/errdefs"
)

// ObjectRef names one Run, Runtime, Function, WorkflowRun or Workflow.
type ObjectRef struct {
	Kind      Kind
	Namespace string
	Name      string
}

func (r ObjectRef) String() string { return string(r.Kind) + "/" + r.Name }

// DeleteOptions are what `stoke delete` deletes, as kubectl takes it:
// objects by name, the objects of a kind a label selector matches, or
// the objects of manifest files.
type DeleteOptions struct {
	// Refs are the objects named on the command line or in files.
	Refs []ObjectRef
	// Kind and Selector delete every object of Kind in the namespace
	// whose labels match (-l); Refs must then be empty.
	Kind     Kind
	Selector string
	// Wait returns once every deleted Run is gone (a function drains and
	// unregisters first).
	Wait bool
	// IgnoreNotFound counts an object that does not exist as deleted.
	IgnoreNotFound bool
}

// RefsOf are the objects of parsed manifests, for `stoke delete -f`.
func RefsOf(objs []manifest.Object) []ObjectRef {
	refs := make([]ObjectRef, 0, len(objs))
	for _, o := range objs {
		switch {
		case o.Run != nil:
			refs = append(refs, ObjectRef{KindRun, o.Run.Namespace, o.Run.Name})
		case o.Runtime != nil:
			refs = append(refs, ObjectRef{KindRuntime, o.Runtime.Namespace, o.Runtime.Name})
		case o.Function != nil:
			refs = append(refs, ObjectRef{KindFunction, o.Function.Namespace, o.Function.Name})
		case o.WorkflowRun != nil:
			refs = append(refs, ObjectRef{KindWorkflowRun, o.WorkflowRun.Namespace, o.WorkflowRun.Name})
		case o.Workflow != nil:
			refs = append(refs, ObjectRef{KindWorkflow, o.Workflow.Namespace, o.Workflow.Name})
		}
	}
	return refs
}

// Delete deletes every object o names (an object without a namespace is
// in ns) and prints "kind/name deleted" for each, in order. An object
// that cannot be deleted (not found, refused) is noted on Err and the
// rest are still deleted, as kubectl does; Delete then fails at the end.
// With o.Wait it returns once every deleted Run is gone.
func Delete(ctx context.Context, c client.API, ns string, o DeleteOptions, s Streams) error {
	refs := o.Refs
	if o.Selector != "" {
		if len(refs) > 0 {
			return errdefs.InvalidArgument("-l", "cannot be used with names or -f")
		}
		var err error
		if refs, err = selected(ctx, c, ns, o.Kind, o.Selector); err != nil {
			return err
		}
		if len(refs) == 0 {
			s.note("no %ss match %s%s", o.Kind, o.Selector, inNamespace(ns))
			return nil
		}
	}
	if len(refs) == 0 {
		return errdefs.InvalidArgument("delete", "name the objects: NAME..., KIND NAME..., KIND/NAME..., -l SELECTOR or -f FILE")
	}
	failed := 0
	var gone []*v1alpha1.Run
	for _, ref := range refs {
		if ref.Namespace == "" {
			ref.Namespace = ns
		}
		run, err := deleteOne(ctx, c, ref)
		if ctx.Err() != nil {
			return interrupted()
		}
		switch {
		case err == nil:
		case errors.Is(err, errdefs.ErrNotFound) && o.IgnoreNotFound:
			continue
		default:
			var unreachable *client.UnreachableError
			if errors.As(err, &unreachable) {
				return err // the rest would fail the same way
			}
			failed++
			s.note("%s: %v", ref, HintFor(c.Target(), err))
			continue
		}
		if run != nil && o.Wait {
			gone = append(gone, run)
			continue
		}
		fmt.Fprintf(s.Out, "%s deleted\n", ref)
	}
	for _, run := range gone {
		_, err := waitRun(ctx, c, run.Namespace, run.Name, string(run.UID), func(*v1alpha1.Run) bool { return false })
		switch {
		case ctx.Err() != nil:
			return interrupted()
		case errors.Is(err, errdefs.ErrNotFound):
			// Gone: what waiting was for.
		case err != nil:
			return err
		}
		fmt.Fprintf(s.Out, "%s deleted\n", Ref(run))
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d objects were not deleted", failed, len(refs))
	}
	return nil
}

// deleteOne deletes one object; for a Run it returns the Run as it was.
func deleteOne(ctx context.Context, c client.API, ref ObjectRef) (*v1alpha1.Run, error) {
	switch ref.Kind {
	case KindRuntime:
		_, err := c.DeleteRuntime(ctx, ref.Namespace, ref.Name)
		return nil, err
	case KindFunction:
		_, err := c.DeleteFunction(ctx, ref.Namespace, ref.Name)
		return nil, err
	case KindWorkflowRun:
		_, err := c.DeleteWorkflowRun(ctx, ref.Namespace, ref.Name)
		return nil, err
	case KindWorkflow:
		_, err := c.DeleteWorkflow(ctx, ref.Namespace, ref.Name)
		return nil, err
	}
	return c.DeleteRun(ctx, ref.Namespace, ref.Name)
}

// selected are the objects of kind in ns whose labels match selector.
func selected(ctx context.Context, c client.API, ns string, kind Kind, selector string) ([]ObjectRef, error) {
	opts := client.ListOptions{LabelSelector: selector}
	var refs []ObjectRef
	switch kind {
	case KindWorkflowRun:
		list, err := c.ListWorkflowRuns(ctx, ns, opts)
		if err != nil {
			return nil, err
		}
		for _, w := range list.Items {
			refs = append(refs, ObjectRef{kind, w.Namespace, w.Name})
		}
		return refs, nil
	case KindWorkflow:
		list, err := c.ListWorkflows(ctx, ns, opts)
		if err != nil {
			return nil, err
		}
		for _, w := range list.Items {
			refs = append(refs, ObjectRef{kind, w.Namespace, w.Name})
		}
		return refs, nil
	}
	if kind == KindFunction {
		list, err := c.ListFunctions(ctx, ns, opts)
		if err != nil {
			return nil, err
		}
		for _, fn := range list.Items {
			refs = append(refs, ObjectRef{KindFunction, fn.Namespace, fn.Name})
		}
		return refs, nil
	}
	if kind == KindRuntime {
		list, err := c.ListRuntimes(ctx, ns, opts)
		if err != nil {
			return nil, err
		}
		for _, rt := range list.Items {
			refs = append(refs, ObjectRef{KindRuntime, rt.Namespace, rt.Name})
		}
		return refs, nil
	}
	list, err := c.ListRuns(ctx, ns, opts)
	if err != nil {
		return nil, err
	}
	for _, r := range list.Items {
		refs = append(refs, ObjectRef{KindRun, r.Namespace, r.Name})
	}
	return refs, nil
}
