package artifact

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/podcopy"
)

// Store is the artifacts of every WorkflowRun in one Backend, within the
// bounds: a name is written once per WorkflowRun (as GitHub's
// upload-artifact@v4 refuses a second upload of a name), an upload past a
// bound keeps nothing. One process writes a WorkflowRun's artifacts (stoke
// up, or the controller's leader): the bounds are checked under a lock per
// WorkflowRun.
type Store struct {
	b     Backend
	lim   Limits
	log   *slog.Logger
	now   func() time.Time
	locks sync.Map // Run key → *sync.Mutex
}

// StoreConfig configures a Store.
type StoreConfig struct {
	Backend Backend
	Logger  *slog.Logger
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Limits are the bounds; a zero field is internal/bounds' (tests
	// set smaller ones).
	Limits Limits
}

// Limits are a Store's bounds.
type Limits struct {
	// Bytes bounds one artifact's files' contents, Files its entries.
	Bytes int64
	Files int
	// Count bounds a WorkflowRun's artifacts, RunBytes their bytes.
	Count    int
	RunBytes int64
}

func (l Limits) orDefaults() Limits {
	if l.Bytes == 0 {
		l.Bytes = bounds.ArtifactBytes
	}
	if l.Files == 0 {
		l.Files = bounds.ArtifactFiles
	}
	if l.Count == 0 {
		l.Count = bounds.Artifacts
	}
	if l.RunBytes == 0 {
		l.RunBytes = bounds.ArtifactRunBytes
	}
	return l
}

// NewStore returns a Store over cfg.Backend.
func NewStore(cfg StoreConfig) *Store {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Store{b: cfg.Backend, lim: cfg.Limits.orDefaults(), log: logging.OrDiscard(cfg.Logger), now: cfg.Now}
}

func (s *Store) lock(run Run) func() {
	m, _ := s.locks.LoadOrStore(run.Namespace+"/"+run.UID, &sync.Mutex{})
	mu := m.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock
}

// Put stores the tar r as the artifact name of run. The tar is checked
// entry by entry as it goes (podcopy.CopyChecked: nothing that would be
// written outside the directory it is extracted in, no devices) and
// written again in the clean form, so what is stored is always safe to
// extract. Refused, with nothing kept: a name the run has already, a tar
// over bounds.ArtifactBytes or bounds.ArtifactFiles, the run's
// bounds.Artifacts-th artifact or bytes over bounds.ArtifactRunBytes.
func (s *Store) Put(ctx context.Context, run Run, name string, r io.Reader) (Artifact, error) {
	if err := ValidName(name); err != nil {
		return Artifact{}, err
	}
	if err := validRun(run); err != nil {
		return Artifact{}, err
	}
	defer s.lock(run)()
	have, err := s.list(ctx, run)
	if err != nil {
		return Artifact{}, err
	}
	var used int64
	for _, a := range have {
		if a.Name == name {
			return Artifact{}, errdefs.Errorf(errdefs.ErrAlreadyExists, "workflowrun %s: an artifact named %s exists already (names are written once per WorkflowRun)", run, name)
		}
		used += a.Size
	}
	if len(have) >= s.lim.Count {
		return Artifact{}, errdefs.Errorf(errdefs.ErrTooLarge, "workflowrun %s: has %d artifacts, the most allowed", run, s.lim.Count)
	}
	limit := min(s.lim.Bytes, s.lim.RunBytes-used)
	// The blob is the clean tar: CopyChecked writes it through a pipe the
	// backend reads. Entry bytes are bounded by CopyChecked, the tar's
	// own by PutBlob (headers add to the contents).
	pr, pw := io.Pipe()
	type copied struct {
		files int
		err   error
	}
	done := make(chan copied, 1)
	go func() {
		n, err := podcopy.CopyCheckedEntries(pw, r, limit, s.lim.Files)
		pw.CloseWithError(err)
		done <- copied{n, err}
	}()
	digest, size, err := s.b.PutBlob(ctx, run, pr, limit+tarOverhead(s.lim.Files))
	pr.CloseWithError(errors.New("the store stopped reading"))
	c := <-done
	if c.err != nil && !errors.Is(c.err, io.ErrClosedPipe) {
		// The tar's own fault (a bad entry, a bound) says more than the
		// backend's read error.
		err = c.err
	}
	if err != nil {
		if errors.Is(err, errdefs.ErrTooLarge) && limit < s.lim.Bytes {
			return Artifact{}, errdefs.Errorf(errdefs.ErrTooLarge, "workflowrun %s: artifact %s: the run's artifacts would be over %d bytes together: %v", run, name, s.lim.RunBytes, err)
		}
		return Artifact{}, fmt.Errorf("workflowrun %s: artifact %s: %w", run, name, err)
	}
	files := c.files
	a := Artifact{Name: name, WorkflowRun: run.Name, Namespace: run.Namespace, UID: run.UID, Digest: digest, Size: size, Files: files, Created: s.now().UTC()}
	data, err := json.Marshal(a)
	if err != nil {
		return Artifact{}, err
	}
	if err := s.b.PutManifest(ctx, run, name, data); err != nil {
		return Artifact{}, fmt.Errorf("workflowrun %s: artifact %s: manifest: %w", run, name, err)
	}
	s.log.Info("artifact stored", "workflowrun", run.Namespace+"/"+run.Name, "workflowrun_uid", run.UID, "artifact", name, "digest", digest, "bytes", size, "files", files)
	return a, nil
}

// tarOverhead is what a tar of n entries may add to their contents: a
// header (and a PAX header) per entry, padding and the end.
func tarOverhead(n int) int64 { return int64(n)*4*512 + 2*512 + 10240 }

// Get returns the artifact name of run and its tar; the caller closes it.
// The bytes are checked against the digest as they are read: a blob that
// does not match ends the read with an error (Internal), never silently.
func (s *Store) Get(ctx context.Context, run Run, name string) (Artifact, io.ReadCloser, error) {
	if err := ValidName(name); err != nil {
		return Artifact{}, nil, err
	}
	if err := validRun(run); err != nil {
		return Artifact{}, nil, err
	}
	a, err := s.manifest(ctx, run, name)
	if err != nil {
		return Artifact{}, nil, err
	}
	rc, err := s.b.OpenBlob(ctx, run, a.Digest)
	if err != nil {
		return Artifact{}, nil, fmt.Errorf("workflowrun %s: artifact %s: %w", run, name, err)
	}
	return a, newVerifier(rc, a.Digest, a.Size), nil
}

func (s *Store) manifest(ctx context.Context, run Run, name string) (Artifact, error) {
	data, err := s.b.Manifest(ctx, run, name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return Artifact{}, errdefs.Errorf(errdefs.ErrNotFound, "workflowrun %s/%s has no artifact named %s", run.Namespace, run.Name, name)
	}
	if err != nil {
		return Artifact{}, err
	}
	var a Artifact
	if err := json.Unmarshal(data, &a); err != nil {
		return Artifact{}, errdefs.Errorf(errdefs.ErrInternal, "workflowrun %s: artifact %s: manifest: %v", run, name, err)
	}
	if err := validDigest(a.Digest); err != nil {
		return Artifact{}, fmt.Errorf("workflowrun %s: artifact %s: manifest: %w", run, name, err)
	}
	return a, nil
}

// List returns run's artifacts, by name.
func (s *Store) List(ctx context.Context, run Run) ([]Artifact, error) {
	if err := validRun(run); err != nil {
		return nil, err
	}
	return s.list(ctx, run)
}

func (s *Store) list(ctx context.Context, run Run) ([]Artifact, error) {
	names, err := s.b.Manifests(ctx, run)
	if err != nil {
		return nil, err
	}
	out := make([]Artifact, 0, len(names))
	for _, n := range names {
		a, err := s.manifest(ctx, run, n)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue // deleted since the listing
		}
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b Artifact) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// DeleteRun deletes all of run's artifacts: its WorkflowRun went.
func (s *Store) DeleteRun(ctx context.Context, run Run) error {
	if err := validRun(run); err != nil {
		return err
	}
	defer s.lock(run)()
	if err := s.b.DeleteRun(ctx, run); err != nil {
		return fmt.Errorf("workflowrun %s: deleting its artifacts: %w", run, err)
	}
	s.locks.Delete(run.Namespace + "/" + run.UID)
	return nil
}
