package standalone

import (
	"context"
	"path/filepath"
	"time"

	"stoke.dev/stoke/internal/artifact"
	"stoke.dev/stoke/internal/workflow"
)

// artifactSweepPeriod is how often the artifacts of deleted WorkflowRuns
// and those past their retention are looked for.
const artifactSweepPeriod = time.Minute

// openArtifacts opens the workflow artifact store: the S3 bucket
// cfg.ArtifactS3 names, else <data>/artifacts.
func openArtifacts(ctx context.Context, cfg Config) (*artifact.Store, error) {
	var backend artifact.Backend
	if cfg.ArtifactS3.Bucket != "" {
		s3, err := artifact.NewS3(ctx, cfg.ArtifactS3)
		if err != nil {
			return nil, err
		}
		backend = s3
	} else {
		local, err := artifact.NewLocal(filepath.Join(cfg.DataDir, "artifacts"))
		if err != nil {
			return nil, err
		}
		backend = local
	}
	return artifact.NewStore(artifact.StoreConfig{Backend: backend, Logger: cfg.Logger}), nil
}

// ArtifactReader serves `stoke artifacts` (the gateway's Artifacts).
func (s *Standalone) ArtifactReader() artifact.Reader {
	return artifact.Reader{Store: s.artifacts, Lookup: workflow.ArtifactLookup(s.store.WorkflowRuns())}
}

// ArtifactMover copies artifacts between a job's workspace on a pod and
// the store, through the pods' exec hop: the workflow engine's.
func (s *Standalone) ArtifactMover() *artifact.Mover { return artifact.NewMover(s.artifacts, s) }

// SweepArtifacts deletes the artifacts of deleted WorkflowRuns and those
// past the retention once; Run does every artifactSweepPeriod.
func (s *Standalone) SweepArtifacts(ctx context.Context) (artifact.SweepResult, error) {
	return s.artifacts.Sweep(ctx, workflow.LiveWorkflowRuns(s.store.WorkflowRuns()), s.cfg.ArtifactRetention)
}

// sweepArtifacts sweeps every artifactSweepPeriod until ctx ends.
func (s *Standalone) sweepArtifacts(ctx context.Context) error {
	s.artifacts.SweepEvery(ctx, artifactSweepPeriod, workflow.LiveWorkflowRuns(s.store.WorkflowRuns()), s.cfg.ArtifactRetention)
	return nil
}
