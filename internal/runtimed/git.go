package runtimed

import (
	"context"
	"errors"
	"fmt"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
)

// gitFetch gives the directory in the git cache that holds the tree of a
// Run's source.git, kept from the cache's pruning until release.
type gitFetch func(ctx context.Context, g *v1alpha1.GitSource) (dir string, release func(), err error)

// errGitFetch marks a failure of git itself (the repository, the
// network, the credentials), apart from a tree that is refused
// (InvalidSpec).
var errGitFetch = errors.New("git")

// gitTree is run's gitFetch: its commit is spec's, or the one its ref
// resolved to when the Run was first materialised (status.sourceCommit),
// or its ref resolved now and recorded there before anything is checked
// out, so that every attempt checks out the same commit.
func (w *worker) gitTree(run *v1alpha1.Run) gitFetch {
	return func(ctx context.Context, g *v1alpha1.GitSource) (string, func(), error) {
		cache := w.d.cfg.Git
		if cache == nil {
			return "", nil, errdefs.Errorf(errdefs.ErrFailedPrecondition, "this runtime pod has no git cache")
		}
		auth := cache.AuthFor(g.URL)
		commit := g.Commit
		if commit == "" {
			commit = run.Status.SourceCommit
		}
		if commit == "" {
			c, err := cache.Resolve(ctx, g.URL, g.Ref, auth)
			if err != nil {
				return "", nil, fmt.Errorf("%w: %w", errGitFetch, err)
			}
			commit = c
		}
		if run.Status.SourceCommit != commit {
			if _, err := w.setStatus(ctx, func(r *v1alpha1.Run) bool {
				if r.Status.SourceCommit == commit {
					return false
				}
				r.Status.SourceCommit = commit
				return true
			}); err != nil {
				return "", nil, fmt.Errorf("recording status.sourceCommit: %w", err)
			}
		}
		dir, release, err := cache.Tree(ctx, g.URL, commit, auth)
		if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) && !errors.Is(err, errdefs.ErrTooLarge) {
			err = fmt.Errorf("%w: %w", errGitFetch, err)
		}
		return dir, release, err
	}
}
