package workflow

import (
	"context"
	"fmt"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/artifact"
	"stoke.dev/stoke/internal/store"
)

// Artifacts copies files between a job's workspace and the WorkflowRun's
// artifact store, for upload-artifact and download-artifact steps:
// internal/artifact's Mover does. The copy goes through the step's Run,
// which runs artifact.HoldCommand in the job's workspace on its pod until Copy
// releases it, so that it ends Succeeded or Failed as the copy did.
type Artifacts interface {
	// Copy carries out c through the running Run c.Run, releases that
	// Run (exit 0 when the copy succeeded, 1 when not) and says what it
	// copied (a warning, say, when an upload matched no file).
	Copy(ctx context.Context, c ArtifactCopy) (message string, err error)
}

// ArtifactCopy is one artifact step's copy.
type ArtifactCopy struct {
	// Upload is upload-artifact; false is download-artifact.
	Upload bool
	// With are the step's with: values, evaluated.
	With map[string]string
	// The WorkflowRun the artifact belongs to.
	Namespace, WorkflowRun, WorkflowRunUID string
	// Run is the step Run in the job's workspace that holds it.
	Run, RunUID string
}

// MoverArtifacts is Artifacts over internal/artifact's Mover (its Step
// copies and releases the hold).
func MoverArtifacts(m *artifact.Mover) Artifacts { return moverArtifacts{m} }

type moverArtifacts struct{ m *artifact.Mover }

func (a moverArtifacts) Copy(ctx context.Context, c ArtifactCopy) (string, error) {
	return a.m.Step(ctx, c.Upload, c.With,
		artifact.Run{Namespace: c.Namespace, UID: c.WorkflowRunUID, Name: c.WorkflowRun},
		artifact.Target{Namespace: c.Namespace, Name: c.Run})
}

// artifactOp is one artifact step to carry out on a worker; err is an
// expression in its with: that did not evaluate.
type artifactOp struct {
	ArtifactCopy
	err error
}

// artifactResult is what an artifact step's copy came to.
type artifactResult struct {
	err     error
	message string
}

// ArtifactLookup finds a WorkflowRun's artifacts by its name in wfs (the
// Lookup of artifact.Reader, in both modes).
func ArtifactLookup(wfs store.Reader[*v1alpha1.WorkflowRun]) artifact.Lookup {
	return func(ctx context.Context, namespace, name string) (artifact.Run, error) {
		wf, err := wfs.Get(ctx, namespace, name)
		if err != nil {
			return artifact.Run{}, err
		}
		return artifact.Run{Namespace: wf.Namespace, UID: string(wf.UID), Name: wf.Name}, nil
	}
}

// LiveWorkflowRuns are the WorkflowRuns wfs has, for the artifact sweep
// (artifact.Live, in both modes).
func LiveWorkflowRuns(wfs store.Reader[*v1alpha1.WorkflowRun]) artifact.Live {
	return func(ctx context.Context) (map[string]bool, error) {
		items, _, err := wfs.List(ctx, store.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list workflowruns: %w", err)
		}
		live := make(map[string]bool, len(items))
		for _, wf := range items {
			live[wf.Namespace+"/"+string(wf.UID)] = true
		}
		return live, nil
	}
}
