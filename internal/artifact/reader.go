package artifact

import (
	"context"
	"io"
)

// Lookup finds the WorkflowRun namespace/name and says which Run its
// artifacts are under (its UID); NotFound when there is none.
type Lookup func(ctx context.Context, namespace, name string) (Run, error)

// Reader serves `stoke artifacts`: a WorkflowRun's artifacts by its name,
// through the HTTP API (gateway.Artifacts).
type Reader struct {
	Store  *Store
	Lookup Lookup
}

// ListArtifacts lists the artifacts of the WorkflowRun namespace/name.
func (r Reader) ListArtifacts(ctx context.Context, namespace, workflowRun string) ([]Artifact, error) {
	run, err := r.Lookup(ctx, namespace, workflowRun)
	if err != nil {
		return nil, err
	}
	return r.Store.List(ctx, run)
}

// OpenArtifact opens one artifact's tar; the caller closes it.
func (r Reader) OpenArtifact(ctx context.Context, namespace, workflowRun, name string) (Artifact, io.ReadCloser, error) {
	if err := ValidName(name); err != nil {
		return Artifact{}, nil, err
	}
	run, err := r.Lookup(ctx, namespace, workflowRun)
	if err != nil {
		return Artifact{}, nil, err
	}
	return r.Store.Get(ctx, run, name)
}
