package selfcopy

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestToCopiesThisExecutable(t *testing.T) {
	dest := filepath.Join(t.TempDir(), "stoke")
	if err := To(dest); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(dest)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("copied %d bytes, want the %d of %s", len(got), len(want), self)
	}
	fi, err := os.Stat(dest)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o755 {
		t.Fatalf("mode %v, want 0755", fi.Mode())
	}
	entries, err := os.ReadDir(filepath.Dir(dest))
	if err != nil || len(entries) != 1 {
		t.Fatalf("directory holds %d entries (%v), want the binary alone", len(entries), err)
	}
}

func TestToAnUnwritableDirectoryFails(t *testing.T) {
	if err := To(filepath.Join(t.TempDir(), "missing", "stoke")); err == nil {
		t.Fatal("copied into a directory that does not exist")
	}
}
