package cli

import (
	"context"
	"errors"
	"fmt"
	"sync"

	apiequality "k8s.io/apimachinery/pkg/api/equality"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/cli/manifest"
	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/errdefs"
)

// Apply sends parsed manifest objects to the server: every Runtime first,
// one by one (so that Runs and Functions in the same files can name
// them), then every Function, one by one (created, "configured" — a
// template change rolls its replicas — or "unchanged"), then every Run, bounds.ApplyCreates at a time; the results are printed in file
// order. A Runtime is created or updated ("created", "configured",
// "unchanged"); a Run is created, or left "unchanged" when a Run of that
// name exists with the same spec. A Run of that name with another spec is
// an error, since a Run cannot change: it is reported, the rest is still
// applied, and Apply fails at the end. A server that cannot be reached
// stops the apply: the rest would fail the same way.
func Apply(ctx context.Context, c client.API, objs []manifest.Object, s Streams) error {
	var runtimes, functions, workflows, wfruns, runs []manifest.Object
	for _, o := range objs {
		switch {
		case o.Runtime != nil:
			runtimes = append(runtimes, o)
		case o.Function != nil:
			functions = append(functions, o)
		case o.Workflow != nil:
			workflows = append(workflows, o)
		case o.WorkflowRun != nil:
			wfruns = append(wfruns, o)
		case o.Run != nil:
			runs = append(runs, o)
		}
	}
	failed := 0
	report := func(o manifest.Object, r applyResult) error {
		if ctx.Err() != nil {
			return interrupted()
		}
		if r.err != nil {
			var unreachable *client.UnreachableError
			if errors.As(r.err, &unreachable) {
				return r.err
			}
			failed++
			s.note("%s: %v", o.Ref(), HintFor(c.Target(), r.err))
			return nil
		}
		fmt.Fprintln(s.Out, r.result)
		return nil
	}
	for _, o := range runtimes {
		result, err := applyRuntime(ctx, c, o.Runtime)
		if err := report(o, applyResult{result, err}); err != nil {
			return err
		}
	}
	for _, o := range functions {
		result, err := applyFunction(ctx, c, o.Function)
		if err := report(o, applyResult{result, err}); err != nil {
			return err
		}
	}
	// Workflows before the WorkflowRuns that may call them; a Workflow
	// may call another applied later in the files, so they go in file
	// order and a call of one not yet stored fails as the server says.
	for _, o := range workflows {
		result, err := applyWorkflow(ctx, c, o.Workflow)
		if err := report(o, applyResult{result, err}); err != nil {
			return err
		}
	}
	for _, o := range wfruns {
		result, err := applyWorkflowRun(ctx, c, o.WorkflowRun)
		if err := report(o, applyResult{result, err}); err != nil {
			return err
		}
	}
	// The creates go out concurrently; each result is reported in file
	// order once it and those before it are in.
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel() // the creates not yet sent are not sent
		wg.Wait()
	}()
	results := make([]chan applyResult, len(runs))
	for i := range results {
		results[i] = make(chan applyResult, 1)
	}
	next := make(chan int)
	for range min(bounds.ApplyCreates, len(runs)) {
		wg.Go(func() {
			for i := range next {
				result, err := applyRun(ctx, c, runs[i].Run)
				results[i] <- applyResult{result, err}
			}
		})
	}
	go func() {
		defer close(next)
		for i := range runs {
			select {
			case next <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	for i, o := range runs {
		var r applyResult
		select {
		case r = <-results[i]:
		case <-ctx.Done():
			return interrupted()
		}
		if err := report(o, r); err != nil {
			return err
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d objects were not applied", failed, len(objs))
	}
	return nil
}

// applyResult is what applying one object printed, or its error.
type applyResult struct {
	result string
	err    error
}

func applyRuntime(ctx context.Context, c client.API, rt *v1alpha1.Runtime) (string, error) {
	ref := "runtime/" + rt.Name
	existing, err := c.GetRuntime(ctx, rt.Namespace, rt.Name)
	verb := "configured"
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		verb = "created"
	case err != nil:
		return "", err
	case apiequality.Semantic.DeepEqual(existing.Spec, rt.Spec) && sameLabels(existing.Labels, rt.Labels) && sameLabels(existing.Annotations, rt.Annotations):
		return ref + " unchanged", nil
	}
	if _, err := c.ApplyRuntime(ctx, rt); err != nil {
		return "", err
	}
	return ref + " " + verb, nil
}

func applyFunction(ctx context.Context, c client.API, fn *v1alpha1.Function) (string, error) {
	ref := "function/" + fn.Name
	existing, err := c.GetFunction(ctx, fn.Namespace, fn.Name)
	verb := "configured"
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		verb = "created"
	case err != nil:
		return "", err
	default:
		// A manifest that leaves spec.replicas unset keeps the stored one.
		want := fn.Spec.DeepCopy()
		if want.Replicas == nil {
			want.Replicas = existing.Spec.Replicas
		}
		if apiequality.Semantic.DeepEqual(existing.Spec, *want) && sameLabels(existing.Labels, fn.Labels) && sameLabels(existing.Annotations, fn.Annotations) {
			return ref + " unchanged", nil
		}
	}
	if _, err := c.ApplyFunction(ctx, fn); err != nil {
		return "", err
	}
	return ref + " " + verb, nil
}

func applyRun(ctx context.Context, c client.API, run *v1alpha1.Run) (string, error) {
	created, err := c.CreateRun(ctx, run)
	if err == nil {
		return Ref(created) + " created", nil
	}
	if !errors.Is(err, errdefs.ErrAlreadyExists) || run.Name == "" {
		return "", err
	}
	existing, gerr := c.GetRun(ctx, run.Namespace, run.Name)
	if gerr != nil {
		return "", err
	}
	if SameRunSpec(&existing.Spec, &run.Spec) {
		return Ref(run) + " unchanged", nil
	}
	return "", errdefs.Errorf(errdefs.ErrAlreadyExists,
		"a run of this name exists with another spec, and a Run cannot change: delete it (stoke delete %s%s) or give this one another name",
		run.Name, namespaceFlag(run.Namespace))
}

// SameRunSpec reports whether a stored Run's spec is what a manifest asks
// for. cancelRequested is left out: it is set by `stoke cancel`, not by a
// manifest.
func SameRunSpec(stored, want *v1alpha1.RunSpec) bool {
	a, b := stored.DeepCopy(), want.DeepCopy()
	a.CancelRequested, b.CancelRequested = false, false
	return apiequality.Semantic.DeepEqual(a, b)
}

func sameLabels(a, b map[string]string) bool {
	return len(a) == len(b) && (len(a) == 0 || apiequality.Semantic.DeepEqual(a, b))
}

func applyWorkflow(ctx context.Context, c client.API, w *v1alpha1.Workflow) (string, error) {
	ref := "workflow/" + w.Name
	existing, err := c.GetWorkflow(ctx, w.Namespace, w.Name)
	verb := "configured"
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		verb = "created"
	case err != nil:
		return "", err
	case apiequality.Semantic.DeepEqual(existing.Spec, w.Spec) && sameLabels(existing.Labels, w.Labels):
		return ref + " unchanged", nil
	}
	if _, err := c.ApplyWorkflow(ctx, w); err != nil {
		return "", err
	}
	return ref + " " + verb, nil
}

// applyWorkflowRun creates a WorkflowRun, or leaves one of the name with
// the same spec "unchanged" (a WorkflowRun cannot change: another spec is
// an error).
func applyWorkflowRun(ctx context.Context, c client.API, w *v1alpha1.WorkflowRun) (string, error) {
	if w.Name != "" {
		existing, err := c.GetWorkflowRun(ctx, w.Namespace, w.Name)
		switch {
		case err == nil && apiequality.Semantic.DeepEqual(existing.Spec, w.Spec):
			return "workflowrun/" + w.Name + " unchanged", nil
		case err == nil:
			return "", errdefs.Errorf(errdefs.ErrAlreadyExists, "workflowrun %s/%s exists with another spec, and a WorkflowRun cannot change: delete it first", w.Namespace, w.Name)
		case !errors.Is(err, errdefs.ErrNotFound):
			return "", err
		}
	}
	created, err := c.CreateWorkflowRun(ctx, w)
	if err != nil {
		return "", err
	}
	return "workflowrun/" + created.Name + " created", nil
}
