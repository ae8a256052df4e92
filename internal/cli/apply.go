package cli

import (
	"context"
	"errors"
	"fmt"

	apiequality "k8s.io/apimachinery/pkg/api/equality"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/cli/manifest"
	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/errdefs"
)

// Apply sends parsed manifest objects to the server: every Runtime first
// (so that Runs in the same files can name them), then every Run, each in
// file order. A Runtime is created or updated ("created", "configured",
// "unchanged"); a Run is created, or left "unchanged" when a Run of that
// name exists with the same spec. A Run of that name with another spec is
// an error, since a Run cannot change: it is reported, the rest is still
// applied, and Apply fails at the end.
func Apply(ctx context.Context, c *client.Client, objs []manifest.Object, s Streams) error {
	var ordered []manifest.Object
	for _, o := range objs {
		if o.Runtime != nil {
			ordered = append(ordered, o)
		}
	}
	for _, o := range objs {
		if o.Run != nil {
			ordered = append(ordered, o)
		}
	}
	failed := 0
	for _, o := range ordered {
		var (
			result string
			err    error
		)
		if o.Runtime != nil {
			result, err = applyRuntime(ctx, c, o.Runtime)
		} else {
			result, err = applyRun(ctx, c, o.Run)
		}
		if ctx.Err() != nil {
			return interrupted()
		}
		if err != nil {
			var unreachable *client.UnreachableError
			if errors.As(err, &unreachable) {
				return err // the rest would fail the same way
			}
			failed++
			s.note("%s: %v", o.Ref(), Hint(err))
			continue
		}
		fmt.Fprintln(s.Out, result)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d objects were not applied", failed, len(ordered))
	}
	return nil
}

func applyRuntime(ctx context.Context, c *client.Client, rt *v1alpha1.Runtime) (string, error) {
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

func applyRun(ctx context.Context, c *client.Client, run *v1alpha1.Run) (string, error) {
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
