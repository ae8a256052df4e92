package runtimed

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/gitsource"
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
		auth, err := w.d.gitAuth(cache, g)
		if err != nil {
			return "", nil, err
		}
		if auth == "" && w.d.cfg.GitSecret != nil && cache.AuthFor(g.URL) != "" {
			// The cache may hold this commit from a Run that fetched it
			// with the Runtime's credentials: a Run without them shows
			// first that the repository lets it read.
			if err := cache.Reachable(ctx, g.URL, ""); err != nil {
				return "", nil, fmt.Errorf("%w: %s%w", errGitFetch, w.d.credentialsHint(err, auth), err)
			}
		}
		commit := g.Commit
		if commit == "" {
			commit = run.Status.SourceCommit
		}
		if commit == "" {
			c, err := cache.Resolve(ctx, g.URL, g.Ref, auth)
			if err != nil {
				return "", nil, fmt.Errorf("%w: %s%w", errGitFetch, w.d.credentialsHint(err, auth), err)
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
			err = fmt.Errorf("%w: %s%w", errGitFetch, w.d.credentialsHint(err, auth), err)
		}
		return dir, release, err
	}
}

// gitAuth is what a fetch of g authenticates with. In Kubernetes mode
// (cfg.GitSecret set) a Run asks for its Runtime's credentials by naming
// their Secret, and a Run naming another Secret is refused: runtimed has
// no right to read Secrets, and the Run would otherwise fetch without
// credentials and fail later with a less clear message.
func (d *Daemon) gitAuth(cache *gitsource.Cache, g *v1alpha1.GitSource) (gitsource.Auth, error) {
	have := d.cfg.GitSecret
	switch {
	case have == nil:
		return cache.AuthFor(g.URL), nil
	case g.CredentialsSecret == "":
		return "", nil
	case *have == "":
		return "", errdefs.InvalidArgument("spec.source.git.credentialsSecret",
			"%s: Runtime %s has no spec.git.credentialsSecret; a Run's git credentials come from its Runtime's", bounds.Quote(g.CredentialsSecret), d.cfg.Pod.Runtime)
	case g.CredentialsSecret != *have:
		return "", errdefs.InvalidArgument("spec.source.git.credentialsSecret",
			"%s is not the Secret of Runtime %s (spec.git.credentialsSecret %s); a Run's git credentials come from its Runtime's", bounds.Quote(g.CredentialsSecret), d.cfg.Pod.Runtime, bounds.Quote(*have))
	}
	return cache.AuthFor(g.URL), nil
}

// credentialsHint says where credentials come from, before git's own
// words (a status message is bounded: the hint must not be cut), when a
// fetch without any was asked for them.
func (d *Daemon) credentialsHint(err error, auth gitsource.Auth) string {
	if auth != "" || !strings.Contains(err.Error(), "could not read Username") {
		return ""
	}
	if d.cfg.GitSecret == nil {
		return "the repository asks for credentials (stoke up --git-credentials gives them): "
	}
	return "the repository asks for credentials: set spec.source.git.credentialsSecret to the Runtime's spec.git.credentialsSecret: "
}
