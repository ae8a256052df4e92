package workflow

import (
	"context"

	"stoke.dev/stoke/internal/artifact"
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
