package source_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"stoke.dev/stoke/internal/cli/source"
	"stoke.dev/stoke/internal/errdefs"
)

func write(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

// entry is one unpacked archive entry.
type entry struct {
	typ     byte
	mode    int64
	content string
}

func unpack(t *testing.T, tgz []byte) map[string]entry {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(tgz))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	out := map[string]entry{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = entry{h.Typeflag, h.Mode, string(b)}
	}
}

func TestPackTextFileIsInline(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "hello.sh"), "echo hi\n", 0o755)
	p, err := source.Pack(filepath.Join(dir, "hello.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if p.File != "hello.sh" || p.Source.Inline == nil || p.Source.Inline.Path != "hello.sh" || p.Source.Inline.Text != "echo hi\n" || p.Source.Archive != nil {
		t.Errorf("Pack = %+v", p)
	}
}

func TestPackBinaryFileIsAOneFileArchive(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "blob.bin"), "\xff\xfe\x00data", 0o644)
	p, err := source.Pack(filepath.Join(dir, "blob.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if p.File != "blob.bin" || p.Source.Archive == nil {
		t.Fatalf("Pack = %+v", p)
	}
	got := unpack(t, p.Source.Archive.TarGz)
	if e := got["blob.bin"]; len(got) != 1 || e.content != "\xff\xfe\x00data" || e.typ != tar.TypeReg {
		t.Errorf("archive = %+v", got)
	}
}

func TestPackDirectory(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "main.sh"), "main", 0o755)
	write(t, filepath.Join(dir, "lib", "util.sh"), "util", 0o600)
	if err := os.Mkdir(filepath.Join(dir, "empty"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("lib/util.sh", filepath.Join(dir, "link.sh")); err != nil {
		t.Fatal(err)
	}
	p, err := source.Pack(dir)
	if err != nil {
		t.Fatal(err)
	}
	if p.File != "" || p.Source.Archive == nil || p.Source.Inline != nil {
		t.Fatalf("Pack = %+v", p)
	}
	got := unpack(t, p.Source.Archive.TarGz)
	want := map[string]entry{
		"empty/":      {tar.TypeDir, 0o755, ""},
		"lib/":        {tar.TypeDir, 0o755, ""},
		"lib/util.sh": {tar.TypeReg, 0o644, "util"},
		"link.sh":     {tar.TypeReg, 0o644, "util"}, // a symlink inside: its target's content
		"main.sh":     {tar.TypeReg, 0o755, "main"},
	}
	if len(got) != len(want) {
		t.Errorf("archive has %d entries, want %d: %+v", len(got), len(want), got)
	}
	for name, w := range want {
		if g, ok := got[name]; !ok || g != w {
			t.Errorf("%s = %+v (present %v), want %+v", name, g, ok, w)
		}
	}

	// Packing is reproducible: same tree, same bytes, whatever the mtimes.
	if err := os.Chtimes(filepath.Join(dir, "main.sh"), tAfter(), tAfter()); err != nil {
		t.Fatal(err)
	}
	again, err := source.Pack(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again.Source.Archive.TarGz, p.Source.Archive.TarGz) {
		t.Error("packing the same tree twice gave different archives")
	}

	// A directory given through a symlink is packed too.
	link := filepath.Join(t.TempDir(), "src")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	viaLink, err := source.Pack(link)
	if err != nil || !bytes.Equal(viaLink.Source.Archive.TarGz, p.Source.Archive.TarGz) {
		t.Errorf("packing through a symlink: %v", err)
	}
}

func TestPackRefuses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  string
		cat   error
	}{
		{"symlink out of the directory", func(t *testing.T, dir string) {
			outside := filepath.Join(t.TempDir(), "secret")
			write(t, outside, "secret", 0o600)
			if err := os.Symlink(outside, filepath.Join(dir, "escape")); err != nil {
				t.Fatal(err)
			}
		}, "points outside", errdefs.ErrInvalidArgument},
		{"symlink with .. out of the directory", func(t *testing.T, dir string) {
			if err := os.Symlink("../..", filepath.Join(dir, "up")); err != nil {
				t.Fatal(err)
			}
		}, "points outside", errdefs.ErrInvalidArgument},
		{"dangling symlink", func(t *testing.T, dir string) {
			if err := os.Symlink("nothing", filepath.Join(dir, "dangling")); err != nil {
				t.Fatal(err)
			}
		}, "dangling", errdefs.ErrInvalidArgument},
		{"symlink to a directory", func(t *testing.T, dir string) {
			if err := os.Mkdir(filepath.Join(dir, "d"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("d", filepath.Join(dir, "dlink")); err != nil {
				t.Fatal(err)
			}
		}, "only symlinks to regular files", errdefs.ErrInvalidArgument},
		{"named pipe", func(t *testing.T, dir string) {
			if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "fifo: only regular files", errdefs.ErrInvalidArgument},
		{"over 1 MiB compressed", func(t *testing.T, dir string) {
			b := make([]byte, source.MaxPacked+1)
			_, _ = rand.Read(b) // incompressible
			write(t, filepath.Join(dir, "random"), string(b), 0o644)
		}, "compressed archive exceeds", errdefs.ErrTooLarge},
		{"over 64 MiB unpacked", func(t *testing.T, dir string) {
			// Sparse zero files: compress well, but add up past the bound.
			for _, n := range []string{"a", "b"} {
				f, err := os.Create(filepath.Join(dir, n))
				if err != nil {
					t.Fatal(err)
				}
				if err := f.Truncate(source.MaxUnpacked/2 + 1); err != nil {
					t.Fatal(err)
				}
				f.Close()
			}
		}, "add up to more than", errdefs.ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, filepath.Join(dir, "ok.sh"), "ok", 0o644)
			tc.setup(t, dir)
			_, err := source.Pack(dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, tc.cat) {
				t.Errorf("Pack = %v, want %v containing %q", err, tc.cat, tc.want)
			}
		})
	}
}

func TestPackLargeFileIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.txt")
	write(t, path, strings.Repeat("x", source.MaxPacked+1), 0o644)
	if _, err := source.Pack(path); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Errorf("Pack = %v, want TooLarge", err)
	}
	if _, err := source.Pack(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing source was packed")
	}
}

func tAfter() (t time.Time) { return time.Unix(1_800_000_000, 0) }
