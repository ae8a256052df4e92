package artifact

import (
	"context"
	"io"
)

// Backend keeps the bytes of artifacts: blobs named by their SHA-256 and
// one small manifest per artifact, both under their WorkflowRun's prefix,
// so that a WorkflowRun's artifacts go with one DeleteRun. Its errors are
// errdefs categories (NotFound for what is not there). The Store above it
// checks names and bounds and orders the calls; a Backend only stores.
type Backend interface {
	// PutBlob stores what r yields, at most limit bytes (TooLarge past
	// it, and nothing kept), under its SHA-256, and returns the digest
	// ("sha256:<hex>") and size. A blob already there stays.
	PutBlob(ctx context.Context, run Run, r io.Reader, limit int64) (digest string, size int64, err error)
	// OpenBlob reads a blob.
	OpenBlob(ctx context.Context, run Run, digest string) (io.ReadCloser, error)
	// DeleteBlob deletes a blob; one not there is no error.
	DeleteBlob(ctx context.Context, run Run, digest string) error
	// Blobs lists run's blobs' digests.
	Blobs(ctx context.Context, run Run) ([]string, error)

	// PutManifest writes (or replaces) the manifest of name.
	PutManifest(ctx context.Context, run Run, name string, data []byte) error
	// Manifest reads the manifest of name.
	Manifest(ctx context.Context, run Run, name string) ([]byte, error)
	// DeleteManifest deletes the manifest of name; one not there is no
	// error.
	DeleteManifest(ctx context.Context, run Run, name string) error
	// Manifests lists run's manifests' names.
	Manifests(ctx context.Context, run Run) ([]string, error)

	// Runs lists the WorkflowRuns that have anything stored (Name
	// empty), for Sweep.
	Runs(ctx context.Context) ([]Run, error)
	// DeleteRun deletes everything of run.
	DeleteRun(ctx context.Context, run Run) error
}
