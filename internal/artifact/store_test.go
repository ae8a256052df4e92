package artifact

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"stoke.dev/stoke/internal/errdefs"
)

// tarFiles is a tar of files (name → content); names ending in "/" are
// directories.
func tarFiles(t testing.TB, files map[string]string) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for name, body := range files {
		h := &tar.Header{Name: name, Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(body))}
		if strings.HasSuffix(name, "/") {
			h = &tar.Header{Name: name, Mode: 0o755, Typeflag: tar.TypeDir}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// untar reads a tar's regular files.
func untar(t testing.TB, r io.Reader) map[string]string {
	t.Helper()
	out := map[string]string{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			out[h.Name] = string(b)
		}
	}
}

// backends are the Backends every store test runs against.
func backends(t *testing.T) map[string]func(t *testing.T) Backend {
	return map[string]func(t *testing.T) Backend{
		"local": func(t *testing.T) Backend {
			b, err := NewLocal(filepath.Join(t.TempDir(), "artifacts"))
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		"s3": newTestS3,
	}
}

func TestStore(t *testing.T) {
	for name, newBackend := range backends(t) {
		t.Run(name, func(t *testing.T) { testStore(t, newBackend(t)) })
	}
}

func testStore(t *testing.T, b Backend) {
	ctx := context.Background()
	now := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	s := NewStore(StoreConfig{Backend: b, Now: func() time.Time { return now }})
	run := Run{Namespace: "default", UID: "0b5c2c1e-1111-4f55-9a0e-2b7c9b1d0a01", Name: "ci"}
	other := Run{Namespace: "default", UID: "0b5c2c1e-2222-4f55-9a0e-2b7c9b1d0a01", Name: "ci2"}
	files := map[string]string{"dist/": "", "dist/a.txt": "alpha", "dist/b.bin": strings.Repeat("b", 100_000)}

	t.Run("put, get, list", func(t *testing.T) {
		a, err := s.Put(ctx, run, "build", bytes.NewReader(tarFiles(t, files)))
		if err != nil {
			t.Fatal(err)
		}
		if a.Files != 3 || a.Size == 0 || !digestRE.MatchString(a.Digest) || a.WorkflowRun != "ci" || !a.Created.Equal(now) {
			t.Fatalf("stored %+v", a)
		}
		got, rc, err := s.Get(ctx, run, "build")
		if err != nil {
			t.Fatal(err)
		}
		if got != a {
			t.Fatalf("get %+v, want %+v", got, a)
		}
		if back := untar(t, rc); back["dist/a.txt"] != "alpha" || back["dist/b.bin"] != files["dist/b.bin"] {
			t.Fatalf("read back %d files", len(back))
		}
		rc.Close()
		if _, err := s.Put(ctx, run, "logs", bytes.NewReader(tarFiles(t, map[string]string{"x.log": "x"}))); err != nil {
			t.Fatal(err)
		}
		list, err := s.List(ctx, run)
		if err != nil || len(list) != 2 || list[0].Name != "build" || list[1].Name != "logs" {
			t.Fatalf("list %+v %v", list, err)
		}
		if list, err := s.List(ctx, other); err != nil || len(list) != 0 {
			t.Fatalf("another run's list %+v %v", list, err)
		}
	})

	t.Run("refused", func(t *testing.T) {
		for _, tc := range []struct {
			name, artifact string
			run            Run
			tar            []byte
			want           error
		}{
			{"a name written before", "build", run, tarFiles(t, map[string]string{"a": "a"}), errdefs.ErrAlreadyExists},
			{"a bad name", "../x", run, tarFiles(t, map[string]string{"a": "a"}), errdefs.ErrInvalidArgument},
			{"a bad namespace", "x", Run{Namespace: "../etc", UID: run.UID}, tarFiles(t, map[string]string{"a": "a"}), errdefs.ErrInvalidArgument},
			{"an entry outside", "escape", run, tarFiles(t, map[string]string{"../x": "a"}), errdefs.ErrInvalidArgument},
			{"not a tar", "junk", run, bytes.Repeat([]byte("j"), 2048), errdefs.ErrInvalidArgument},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if _, err := s.Put(ctx, tc.run, tc.artifact, bytes.NewReader(tc.tar)); !errors.Is(err, tc.want) {
					t.Fatalf("got %v, want %v", err, tc.want)
				}
			})
		}
		// Nothing of the refused ones is kept: two artifacts, two blobs.
		list, _ := s.List(ctx, run)
		blobs, err := b.Blobs(ctx, run)
		if len(list) != 2 || err != nil || len(blobs) != 2 {
			t.Fatalf("after refusals: %d artifacts, blobs %v %v", len(list), blobs, err)
		}
	})

	t.Run("not found", func(t *testing.T) {
		if _, _, err := s.Get(ctx, run, "nope"); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "no artifact named nope") {
			t.Fatalf("got %v", err)
		}
	})

	t.Run("a damaged blob is an error, not data", func(t *testing.T) {
		a, err := s.Put(ctx, other, "victim", bytes.NewReader(tarFiles(t, map[string]string{"f": "original"})))
		if err != nil {
			t.Fatal(err)
		}
		// Replace the blob under the same digest.
		if err := b.DeleteBlob(ctx, other, a.Digest); err != nil {
			t.Fatal(err)
		}
		damaged := tarFiles(t, map[string]string{"f": "damaged!"})
		if err := putBlobAs(ctx, b, other, a.Digest, damaged); err != nil {
			t.Fatal(err)
		}
		_, rc, err := s.Get(ctx, other, "victim")
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		if _, err := io.Copy(io.Discard, rc); !errors.Is(err, errdefs.ErrInternal) || !strings.Contains(err.Error(), "damaged") {
			t.Fatalf("read of a damaged blob: %v", err)
		}
	})

	t.Run("delete with the run", func(t *testing.T) {
		if err := s.DeleteRun(ctx, run); err != nil {
			t.Fatal(err)
		}
		if list, err := s.List(ctx, run); err != nil || len(list) != 0 {
			t.Fatalf("after delete: %+v %v", list, err)
		}
		if blobs, err := b.Blobs(ctx, run); err != nil || len(blobs) != 0 {
			t.Fatalf("blobs after delete: %v %v", blobs, err)
		}
		if list, err := s.List(ctx, other); err != nil || len(list) != 1 {
			t.Fatalf("the other run's after delete: %+v %v", list, err)
		}
	})
}

// putBlobAs writes data under digest, whatever its real digest: a damaged
// store, for the test.
func putBlobAs(ctx context.Context, b Backend, run Run, digest string, data []byte) error {
	switch b := b.(type) {
	case *Local:
		return os.WriteFile(b.blobPath(run, digest), data, 0o600)
	case *S3:
		return b.putObject(ctx, b.blobKey(run, digest), data)
	}
	return errors.New("unknown backend")
}

func TestStoreBounds(t *testing.T) {
	ctx := context.Background()
	b, err := NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	lim := Limits{Bytes: 1000, Files: 5, Count: 4, RunBytes: 1500}
	s := NewStore(StoreConfig{Backend: b, Limits: lim})
	run := Run{Namespace: "default", UID: "u1", Name: "r"}
	t.Run("bytes", func(t *testing.T) {
		_, err := s.Put(ctx, run, "big", bytes.NewReader(tarFiles(t, map[string]string{"a": strings.Repeat("x", 1001)})))
		if !errors.Is(err, errdefs.ErrTooLarge) || !strings.Contains(err.Error(), "over 1000 bytes") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("run bytes", func(t *testing.T) {
		if _, err := s.Put(ctx, run, "first", bytes.NewReader(tarFiles(t, map[string]string{"a": strings.Repeat("x", 900)}))); err != nil {
			t.Fatal(err)
		}
		_, err := s.Put(ctx, run, "second", bytes.NewReader(tarFiles(t, map[string]string{"b": strings.Repeat("y", 900)})))
		if !errors.Is(err, errdefs.ErrTooLarge) || !strings.Contains(err.Error(), "together") {
			t.Fatalf("got %v", err)
		}
		if err := s.DeleteRun(ctx, run); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("files", func(t *testing.T) {
		many := map[string]string{}
		for i := range lim.Files + 1 {
			many["f"+strconv.Itoa(i)] = ""
		}
		_, err := s.Put(ctx, run, "many", bytes.NewReader(tarFiles(t, many)))
		if !errors.Is(err, errdefs.ErrTooLarge) || !strings.Contains(err.Error(), "entries") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("count", func(t *testing.T) {
		s := NewStore(StoreConfig{Backend: b, Limits: Limits{Count: lim.Count}})
		one := tarFiles(t, map[string]string{"a": "a"})
		for i := range lim.Count {
			if _, err := s.Put(ctx, run, "a"+strconv.Itoa(i), bytes.NewReader(one)); err != nil {
				t.Fatal(err)
			}
		}
		_, err := s.Put(ctx, run, "onemore", bytes.NewReader(one))
		if !errors.Is(err, errdefs.ErrTooLarge) || !strings.Contains(err.Error(), "the most allowed") {
			t.Fatalf("got %v", err)
		}
	})
	if blobs, _ := b.Blobs(ctx, run); len(blobs) != 1 {
		t.Fatalf("blobs %v: the same content is one blob", blobs)
	}
}

func TestSweep(t *testing.T) {
	for name, newBackend := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			b := newBackend(t)
			now := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
			s := NewStore(StoreConfig{Backend: b, Now: func() time.Time { return now }})
			gone := Run{Namespace: "default", UID: "gone", Name: "old"}
			kept := Run{Namespace: "team-a", UID: "kept", Name: "new"}
			put := func(run Run, name, body string) {
				if _, err := s.Put(ctx, run, name, bytes.NewReader(tarFiles(t, map[string]string{"f": body}))); err != nil {
					t.Fatal(err)
				}
			}
			put(gone, "a", "1")
			put(kept, "old", "2")
			put(kept, "shared-old", "3")
			now = now.Add(48 * time.Hour)
			put(kept, "shared-new", "3") // the same blob as shared-old
			put(kept, "new", "4")
			live := func(context.Context) (map[string]bool, error) { return map[string]bool{"team-a/kept": true}, nil }
			res, err := s.Sweep(ctx, live, 24*time.Hour)
			if err != nil || res != (SweepResult{Runs: 1, Expired: 2}) {
				t.Fatalf("sweep: %+v %v", res, err)
			}
			if runs, err := b.Runs(ctx); err != nil || len(runs) != 1 || runs[0].UID != "kept" {
				t.Fatalf("runs left %+v %v", runs, err)
			}
			list, _ := s.List(ctx, kept)
			blobs, _ := b.Blobs(ctx, kept)
			if len(list) != 2 || list[0].Name != "new" || list[1].Name != "shared-new" || len(blobs) != 2 {
				t.Fatalf("left %+v, blobs %v", list, blobs)
			}
			// The shared blob stays readable.
			_, rc, err := s.Get(ctx, kept, "shared-new")
			if err != nil {
				t.Fatal(err)
			}
			if got := untar(t, rc); got["f"] != "3" {
				t.Fatalf("shared blob %v", got)
			}
			rc.Close()
		})
	}
}
