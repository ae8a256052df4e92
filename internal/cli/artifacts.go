package cli

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/util/duration"

	"stoke.dev/stoke/internal/artifact"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/client"
)

// ArtifactsList prints the artifacts of the WorkflowRun ns/workflowRun:
// name, files, size, digest and age.
func ArtifactsList(ctx context.Context, c client.API, ns, workflowRun string, now func() time.Time, s Streams) error {
	items, err := c.ListArtifacts(ctx, ns, workflowRun)
	if err != nil {
		return err
	}
	if len(items) == 0 {
		s.note("workflowrun %s has no artifacts", workflowRun)
		return nil
	}
	tw := tabwriter.NewWriter(s.Out, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "NAME\tFILES\tSIZE\tDIGEST\tAGE")
	for _, a := range items {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", a.Name, a.Files, a.Size, a.Digest, duration.HumanDuration(now().Sub(a.Created)))
	}
	return tw.Flush()
}

// ArtifactsGet writes the artifact name of the WorkflowRun ns/workflowRun
// into dir (made if missing), checked entry by entry and against its
// digest (artifact.Extract), and notes what it wrote.
func ArtifactsGet(ctx context.Context, c client.API, ns, workflowRun, name, dir string, s Streams) error {
	a, rc, err := c.OpenArtifact(ctx, ns, workflowRun, name)
	if err != nil {
		return err
	}
	defer rc.Close()
	n, err := artifact.Extract(dir, rc, bounds.ArtifactBytes)
	if err != nil {
		return fmt.Errorf("artifact %s of workflowrun %s: %w", name, workflowRun, err)
	}
	s.note("wrote %d files of artifact %s (%s) into %s", n, name, a.Digest, dir)
	return nil
}
