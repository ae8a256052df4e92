// Package artifact keeps a WorkflowRun's artifacts: the files a step's
// `uses: upload-artifact` takes from its job's workspace, which a later
// job's `uses: download-artifact` restores on any pod.
//
// An artifact is one tar, keyed by (namespace, WorkflowRun UID, name) and
// stored content-addressed: the blob's key is its SHA-256, and a small
// manifest names it. A Store keeps them in a Backend — a directory under
// the data directory in standalone (NewLocal), an S3-compatible bucket in
// Kubernetes and Lambda (NewS3) — within the bounds of internal/bounds
// (Artifact*): bytes and files per artifact, artifacts and bytes per
// WorkflowRun. They go with their WorkflowRun (Store.DeleteRun, Sweep) and
// after a bounded retention.
//
// A Mover copies between a Run's workspace and the Store through the Exec
// service (package podcopy: a tar through an exec session, every entry
// checked), so it reaches a job's pod wherever exec does. The workflow
// engine's step Run for an artifact step runs HoldCommand, so that the
// copy has a live Run in the job's workspace to exec into, and Release
// ends it once the copy is done (mover.go says how).
package artifact

import (
	"fmt"
	"regexp"
	"time"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

// Run names a WorkflowRun's artifacts: its namespace and UID (a
// WorkflowRun deleted and created again under its name has none of the
// old one's artifacts).
type Run struct {
	Namespace string
	UID       string
	// Name is the WorkflowRun's name, kept in each manifest for people;
	// the key is the UID.
	Name string
}

func (r Run) String() string { return r.Namespace + "/" + r.Name + " (uid " + r.UID + ")" }

// Artifact is one stored artifact: its manifest.
type Artifact struct {
	Name string `json:"name"`
	// WorkflowRun is its WorkflowRun's name; Namespace and UID key it.
	WorkflowRun string `json:"workflowRun"`
	Namespace   string `json:"namespace"`
	UID         string `json:"uid"`
	// Digest is "sha256:<hex>" of the tar.
	Digest string `json:"digest"`
	// Size is the tar's size in bytes; Files the entries in it
	// (directories and links included).
	Size    int64     `json:"size"`
	Files   int       `json:"files"`
	Created time.Time `json:"created"`
}

// nameRE is what an artifact's name may be: it is a file name in the
// local backend and part of a key and a URL path elsewhere.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]*$`)

// ValidName checks an artifact's name.
func ValidName(name string) error {
	switch {
	case name == "":
		return errdefs.InvalidArgument("name", "an artifact needs a name")
	case len(name) > bounds.ArtifactName:
		return errdefs.InvalidArgument("name", "is %d bytes, at most %d allowed", len(name), bounds.ArtifactName)
	case !nameRE.MatchString(name):
		return errdefs.InvalidArgument("name", "%q: letters, digits, '.', '_' and '-' only, not starting with '.' or '-'", bounds.Truncate(name, bounds.Quoted))
	}
	return nil
}

// validRun checks the key of a WorkflowRun's artifacts, which become path
// elements and key prefixes.
func validRun(r Run) error {
	for _, f := range []struct{ field, v string }{{"namespace", r.Namespace}, {"uid", r.UID}} {
		if f.v == "" || len(f.v) > 253 || !nameRE.MatchString(f.v) {
			return errdefs.InvalidArgument(f.field, "%q is not a namespace or UID", bounds.Truncate(f.v, bounds.Quoted))
		}
	}
	return nil
}

// digestRE is a blob's digest as the store writes it.
var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

func validDigest(d string) error {
	if !digestRE.MatchString(d) {
		return fmt.Errorf("%q is not a sha256 digest: %w", bounds.Truncate(d, bounds.Quoted), errdefs.ErrInternal)
	}
	return nil
}
