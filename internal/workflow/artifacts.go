package workflow

import (
	"context"
)

// Artifacts copies files between a job's workspace and the WorkflowRun's
// artifact store, for upload-artifact and download-artifact steps:
// internal/artifact's Mover does. The copy goes through the step's Run,
// which runs holdCommand in the job's workspace on its pod until Copy
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

// holdScript keeps an artifact step's Run running until its copy is done:
// USR1 ends it with 0, USR2 with 1 (internal/artifact's Release sends
// them). The sleep in the background lets the shell take a signal at
// once; it goes with the task's process group.
const holdScript = `trap 'exit 0' USR1; trap 'exit 1' USR2; while :; do sleep 3600 & wait $!; done`

func holdCommand() []string { return []string{"sh", "-c", holdScript, "stoke-artifact-step"} }

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
