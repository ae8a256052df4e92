package standalone

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"stoke.dev/stoke/internal/artifact"
	"stoke.dev/stoke/internal/store"
)

// artifactSweepPeriod is how often the artifacts of deleted WorkflowRuns
// and those past their retention are looked for.
const artifactSweepPeriod = time.Minute

// openArtifacts opens the workflow artifact store in <data>/artifacts.
func openArtifacts(cfg Config) (*artifact.Store, error) {
	local, err := artifact.NewLocal(filepath.Join(cfg.DataDir, "artifacts"))
	if err != nil {
		return nil, err
	}
	return artifact.NewStore(artifact.StoreConfig{Backend: local, Logger: cfg.Logger}), nil
}

// ArtifactReader serves `stoke artifacts` (the gateway's Artifacts).
func (s *Standalone) ArtifactReader() artifact.Reader {
	return artifact.Reader{Store: s.artifacts, Lookup: s.lookupWorkflowRun}
}

// ArtifactMover copies artifacts between a job's workspace on a pod and
// the store, through the pods' exec hop: the workflow engine's.
func (s *Standalone) ArtifactMover() *artifact.Mover { return artifact.NewMover(s.artifacts, s) }

// lookupWorkflowRun finds a WorkflowRun's artifacts by its name.
func (s *Standalone) lookupWorkflowRun(ctx context.Context, namespace, name string) (artifact.Run, error) {
	wf, err := s.store.WorkflowRuns().Get(ctx, namespace, name)
	if err != nil {
		return artifact.Run{}, err
	}
	return artifact.Run{Namespace: wf.Namespace, UID: string(wf.UID), Name: wf.Name}, nil
}

// liveWorkflowRuns are the WorkflowRuns there are, for the sweep.
func (s *Standalone) liveWorkflowRuns(ctx context.Context) (map[string]bool, error) {
	items, _, err := s.store.WorkflowRuns().List(ctx, store.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list workflowruns: %w", err)
	}
	live := make(map[string]bool, len(items))
	for _, wf := range items {
		live[wf.Namespace+"/"+string(wf.UID)] = true
	}
	return live, nil
}

// SweepArtifacts deletes the artifacts of deleted WorkflowRuns and those
// past the retention once; Run does every artifactSweepPeriod.
func (s *Standalone) SweepArtifacts(ctx context.Context) (artifact.SweepResult, error) {
	return s.artifacts.Sweep(ctx, s.liveWorkflowRuns, s.cfg.ArtifactRetention)
}

// sweepArtifacts sweeps every artifactSweepPeriod until ctx ends.
func (s *Standalone) sweepArtifacts(ctx context.Context) error {
	s.artifacts.SweepEvery(ctx, artifactSweepPeriod, s.liveWorkflowRuns, s.cfg.ArtifactRetention)
	return nil
}
