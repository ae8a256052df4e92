package runtime

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestMakeDir(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "a")
	if err := MakeDir(dir); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("made %v, %v; want a 0700 directory", fi, err)
	}
	if err := MakeDir(dir); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second MakeDir: %v, want fs.ErrExist", err)
	}
	deep := filepath.Join(root, "b", "c", "d")
	if err := MakeDir(deep); err != nil {
		t.Fatalf("missing parents: %v", err)
	}
	if fi, err := os.Stat(deep); err != nil || !fi.IsDir() {
		t.Fatalf("made %v, %v", fi, err)
	}
}

func TestRemoveDir(t *testing.T) {
	root := t.TempDir()
	empty := filepath.Join(root, "empty")
	full := filepath.Join(root, "full")
	for _, p := range []string{empty, filepath.Join(full, "sub", "deeper")} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(full, "sub", "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{empty, full, filepath.Join(root, "missing")} {
		if err := RemoveDir(p); err != nil {
			t.Fatalf("RemoveDir(%s): %v", p, err)
		}
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s still there: %v", p, err)
		}
	}
}

func TestRemoveScratch(t *testing.T) {
	for _, extra := range []string{"", "outputs", "other"} {
		scratch := filepath.Join(t.TempDir(), "task_x")
		if err := os.MkdirAll(filepath.Join(scratch, scratchTmp, "left"), 0o700); err != nil {
			t.Fatal(err)
		}
		if extra != "" {
			if err := os.WriteFile(filepath.Join(scratch, extra), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := removeScratch(scratch); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(scratch); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("with %q: scratch still there: %v", extra, err)
		}
	}
}

// The fast path of Resolve answers exactly as the general one: a symlink
// below the root, even to a directory inside it, is followed and checked.
func TestWorkspaceResolveBelowRoot(t *testing.T) {
	root := t.TempDir()
	w, err := NewWorkspace(root)
	if err != nil {
		t.Fatal(err)
	}
	root = w.Root()
	outside := t.TempDir()
	for _, p := range []string{"a/b", "in"} {
		if err := os.MkdirAll(filepath.Join(root, p), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "a", "out")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "in"), filepath.Join(root, "a", "link")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		dir, want string // want "" is refused
	}{
		{root + "/a/b", root + "/a/b"},
		{root, root},
		{root + "/a/link", root + "/in"},
		{root + "/a/out", ""},
		{root + "/a/out/x", ""},
		{root + "/file", ""},
		{root + "/missing", ""},
		{root + "/a/../a/b", root + "/a/b"},
		{outside, ""},
	}
	for _, tc := range tests {
		got, err := w.Resolve("working_dir", tc.dir)
		if tc.want == "" {
			if err == nil {
				t.Errorf("Resolve(%s) = %s, want refused", tc.dir, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Resolve(%s) = %q, %v; want %q", tc.dir, got, err, tc.want)
		}
	}
}
