package artifact

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"stoke.dev/stoke/internal/errdefs"
)

// Local is the Backend of standalone Stoke: a directory (under the data
// directory, `<data>/artifacts`) holding <namespace>/<uid>/blobs/<hex>
// and <namespace>/<uid>/manifests/<name>.json. A file is written to a
// temporary file beside its place, fsynced and renamed into it, and the
// directory fsynced, so that a crash leaves the old file or the new one,
// never a part.
type Local struct {
	dir string
}

// NewLocal returns the backend in dir, which it makes (0700) if missing.
func NewLocal(dir string) (*Local, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("artifact store: %w", err)
	}
	return &Local{dir: dir}, nil
}

var _ Backend = (*Local)(nil)

func (l *Local) runDir(run Run) string { return filepath.Join(l.dir, run.Namespace, run.UID) }

func (l *Local) blobPath(run Run, digest string) string {
	return filepath.Join(l.runDir(run), "blobs", strings.TrimPrefix(digest, "sha256:"))
}

func (l *Local) manifestPath(run Run, name string) string {
	return filepath.Join(l.runDir(run), "manifests", name+".json")
}

// PutBlob implements Backend.
func (l *Local) PutBlob(ctx context.Context, run Run, r io.Reader, limit int64) (string, int64, error) {
	dir := filepath.Join(l.runDir(run), "blobs")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", 0, err
	}
	tmp, err := os.CreateTemp(dir, ".upload-*")
	if err != nil {
		return "", 0, err
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing
	h := newHashingReader(r, limit)
	if _, err := io.Copy(tmp, ctxReader{ctx, h}); err != nil {
		tmp.Close()
		return "", 0, err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return "", 0, err
	}
	if err := tmp.Close(); err != nil {
		return "", 0, err
	}
	digest := h.digest()
	if err := os.Rename(tmp.Name(), l.blobPath(run, digest)); err != nil {
		return "", 0, err
	}
	return digest, h.n, syncDir(dir)
}

// ctxReader ends a copy when its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// OpenBlob implements Backend.
func (l *Local) OpenBlob(_ context.Context, run Run, digest string) (io.ReadCloser, error) {
	if err := validDigest(digest); err != nil {
		return nil, err
	}
	f, err := os.Open(l.blobPath(run, digest))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "blob %s is not in the store", digest)
	}
	return f, err
}

// DeleteBlob implements Backend.
func (l *Local) DeleteBlob(_ context.Context, run Run, digest string) error {
	if err := validDigest(digest); err != nil {
		return err
	}
	return removeIfThere(l.blobPath(run, digest))
}

// Blobs implements Backend.
func (l *Local) Blobs(_ context.Context, run Run) ([]string, error) {
	names, err := readNames(filepath.Join(l.runDir(run), "blobs"))
	var out []string
	for _, n := range names {
		if !strings.HasPrefix(n, ".") {
			out = append(out, "sha256:"+n)
		}
	}
	return out, err
}

// PutManifest implements Backend.
func (l *Local) PutManifest(_ context.Context, run Run, name string, data []byte) error {
	dir := filepath.Join(l.runDir(run), "manifests")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return writeFileAtomic(dir, name+".json", data)
}

// Manifest implements Backend.
func (l *Local) Manifest(_ context.Context, run Run, name string) ([]byte, error) {
	b, err := os.ReadFile(l.manifestPath(run, name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "no manifest %s", name)
	}
	return b, err
}

// DeleteManifest implements Backend.
func (l *Local) DeleteManifest(_ context.Context, run Run, name string) error {
	return removeIfThere(l.manifestPath(run, name))
}

// Manifests implements Backend.
func (l *Local) Manifests(_ context.Context, run Run) ([]string, error) {
	names, err := readNames(filepath.Join(l.runDir(run), "manifests"))
	var out []string
	for _, n := range names {
		if name, ok := strings.CutSuffix(n, ".json"); ok && !strings.HasPrefix(n, ".") {
			out = append(out, name)
		}
	}
	return out, err
}

// Runs implements Backend.
func (l *Local) Runs(context.Context) ([]Run, error) {
	namespaces, err := readNames(l.dir)
	if err != nil {
		return nil, err
	}
	var out []Run
	for _, ns := range namespaces {
		uids, err := readNames(filepath.Join(l.dir, ns))
		if err != nil {
			return nil, err
		}
		for _, uid := range uids {
			out = append(out, Run{Namespace: ns, UID: uid})
		}
	}
	return out, nil
}

// DeleteRun implements Backend.
func (l *Local) DeleteRun(_ context.Context, run Run) error {
	if err := os.RemoveAll(l.runDir(run)); err != nil {
		return err
	}
	// An emptied namespace directory goes too; one another run is being
	// written into stays (Remove fails on a non-empty directory).
	_ = os.Remove(filepath.Join(l.dir, run.Namespace))
	return nil
}

// readNames lists a directory's entries; a missing directory has none.
func readNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(entries))
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out, nil
}

func removeIfThere(p string) error {
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// writeFileAtomic writes name in dir by a temporary file, fsync and
// rename, then fsyncs dir.
func writeFileAtomic(dir, name string, data []byte) error {
	tmp, err := os.CreateTemp(dir, "."+name+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
