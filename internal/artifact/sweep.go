package artifact

import (
	"context"
	"errors"
	"fmt"
	"time"

	"stoke.dev/stoke/internal/bounds"
)

// Live says which WorkflowRuns exist: their "namespace/uid" keys.
type Live func(ctx context.Context) (map[string]bool, error)

// SweepResult counts what a sweep deleted.
type SweepResult struct {
	// Runs are WorkflowRuns whose artifacts went because the WorkflowRun
	// did; Expired artifacts past the retention.
	Runs, Expired int
}

// Sweep deletes the artifacts of WorkflowRuns that no longer exist, and
// those older than retention (0: bounds.ArtifactRetentionDefault; at most
// bounds.ArtifactRetention) with the blobs only they used. The engine
// deletes a WorkflowRun's artifacts when it sees the WorkflowRun go
// (Store.DeleteRun); the sweep catches what that missed (a delete while
// the control plane was down) and applies the retention.
func (s *Store) Sweep(ctx context.Context, live Live, retention time.Duration) (SweepResult, error) {
	if retention <= 0 {
		retention = bounds.ArtifactRetentionDefault
	}
	retention = min(retention, bounds.ArtifactRetention)
	var res SweepResult
	runs, err := s.b.Runs(ctx)
	if err != nil {
		return res, fmt.Errorf("artifact sweep: %w", err)
	}
	alive, err := live(ctx)
	if err != nil {
		return res, fmt.Errorf("artifact sweep: the WorkflowRuns: %w", err)
	}
	var errs []error
	for _, run := range runs {
		if !alive[run.Namespace+"/"+run.UID] {
			if err := s.DeleteRun(ctx, run); err != nil {
				errs = append(errs, err)
				continue
			}
			res.Runs++
			s.log.Info("artifacts deleted with their WorkflowRun", "namespace", run.Namespace, "workflowrun_uid", run.UID)
			continue
		}
		n, err := s.expire(ctx, run, s.now().Add(-retention))
		res.Expired += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return res, errors.Join(errs...)
}

// expire deletes run's artifacts created before cutoff, then the blobs no
// artifact left names.
func (s *Store) expire(ctx context.Context, run Run, cutoff time.Time) (int, error) {
	defer s.lock(run)()
	have, err := s.list(ctx, run)
	if err != nil {
		return 0, err
	}
	used := map[string]bool{}
	n := 0
	for _, a := range have {
		if a.Created.Before(cutoff) {
			if err := s.b.DeleteManifest(ctx, run, a.Name); err != nil {
				return n, err
			}
			n++
			s.log.Info("artifact expired", "namespace", run.Namespace, "workflowrun", a.WorkflowRun, "workflowrun_uid", run.UID, "artifact", a.Name, "created", a.Created)
			continue
		}
		used[a.Digest] = true
	}
	if n == 0 {
		return 0, nil
	}
	blobs, err := s.b.Blobs(ctx, run)
	if err != nil {
		return n, err
	}
	for _, d := range blobs {
		if !used[d] {
			if err := s.b.DeleteBlob(ctx, run, d); err != nil {
				return n, err
			}
		}
	}
	return n, nil
}

// SweepEvery runs Sweep every period until ctx ends, logging what it did
// and its errors (a failed sweep is tried again the next period).
func (s *Store) SweepEvery(ctx context.Context, period time.Duration, live Live, retention time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		if res, err := s.Sweep(ctx, live, retention); err != nil {
			s.log.Warn("artifact sweep", "error", err, "runs", res.Runs, "expired", res.Expired)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
