package shm

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// This machine, like any Linux with a standard /dev, mounts a tmpfs there;
// the warm Bash runtime's speed figures assume it.
func TestMkdirTempIsPrivateAndOnTmpfs(t *testing.T) {
	if !Usable() {
		t.Fatalf("%s is not a writable tmpfs here", Root)
	}
	dir, err := MkdirTemp(t.TempDir(), "stoke-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if filepath.Dir(dir) != Root {
		t.Errorf("made %s, not in %s", dir, Root)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Errorf("mode %v, want a directory with 0700", fi.Mode())
	}
}

func TestRemoveRecordedRemovesOnlyItsOwn(t *testing.T) {
	own, err := os.MkdirTemp(Root, "stoke-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(own)
	if err := os.WriteFile(filepath.Join(own, "req.1"), []byte("payload"), 0o600); err != nil {
		t.Fatal(err)
	}
	elsewhere := t.TempDir()
	link := filepath.Join(Root, "stoke-test-link-"+filepath.Base(elsewhere))
	if err := os.Symlink(elsewhere, link); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(link)
	other, err := os.MkdirTemp(Root, "other-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(other)

	for _, bad := range []string{
		elsewhere,                             // not in Root
		other,                                 // not this prefix
		link,                                  // a symbolic link
		filepath.Join(own, "..", "..", "tmp"), // climbs out
		Root,
	} {
		if err := RemoveRecorded(bad, "stoke-test-"); err == nil {
			t.Errorf("RemoveRecorded(%q) succeeded", bad)
		}
	}
	for _, kept := range []string{elsewhere, other, link} {
		if _, err := os.Lstat(kept); err != nil {
			t.Errorf("%s: %v", kept, err)
		}
	}
	if err := RemoveRecorded(own, "stoke-test-"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(own); !os.IsNotExist(err) {
		t.Errorf("%s is still there: %v", own, err)
	}
	// Gone already is done.
	if err := RemoveRecorded(own, "stoke-test-"); err != nil {
		t.Errorf("removing it again: %v", err)
	}
}

// The record comes before the directory: a process that dies between the
// two leaves a record of nothing, never a directory nobody knows of.
func TestMkdirRecordedRecordsFirst(t *testing.T) {
	var recorded string
	dir, err := MkdirRecorded(t.TempDir(), "stoke-test-", func(d string) error {
		if _, err := os.Lstat(d); !os.IsNotExist(err) {
			t.Errorf("%s exists before it is recorded: %v", d, err)
		}
		recorded = d
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if dir != recorded || filepath.Dir(dir) != Root {
		t.Errorf("made %s, recorded %q", dir, recorded)
	}
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Errorf("%s: %v %v", dir, fi, err)
	}
	// A record that cannot be written makes nothing.
	prefix := "stoke-test-unrecorded-" + strconv.Itoa(os.Getpid()) + "-"
	if _, err := MkdirRecorded(t.TempDir(), prefix, func(string) error { return os.ErrPermission }); err == nil {
		t.Error("MkdirRecorded succeeded without its record")
	}
	entries, err := os.ReadDir(Root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			t.Errorf("%s was made without its record", e.Name())
		}
	}
}
