package shm

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// On a Linux with a standard /dev (this one, Debian, containers) Root is a
// writable tmpfs and the directory is made there; elsewhere in fallback.
func TestMkdirTempIsPrivate(t *testing.T) {
	fallback := t.TempDir()
	want := fallback
	if Usable() {
		want = Root
	}
	dir, err := MkdirTemp(fallback, "stoke-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if filepath.Dir(dir) != want {
		t.Errorf("made %s, not in %s", dir, want)
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
	elsewhere := t.TempDir()
	for _, bad := range []string{
		elsewhere,                                // not in Root
		filepath.Join(Root, "other-dir"),         // not this prefix
		filepath.Join(Root, "..", "tmp"),         // climbs out
		filepath.Join(elsewhere, "stoke-test-x"), // this prefix, elsewhere
		Root,
	} {
		if err := RemoveRecorded(bad, "stoke-test-"); err == nil {
			t.Errorf("RemoveRecorded(%q) succeeded", bad)
		}
	}
	if _, err := os.Lstat(elsewhere); err != nil {
		t.Errorf("%s: %v", elsewhere, err)
	}
	// Gone already is done.
	if err := RemoveRecorded(filepath.Join(Root, "stoke-test-never-made"), "stoke-test-"); err != nil {
		t.Errorf("removing a directory that does not exist: %v", err)
	}
	if !Usable() {
		return // nothing can be made in Root here; the refusals above are the test
	}
	own, err := os.MkdirTemp(Root, "stoke-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(own)
	if err := os.WriteFile(filepath.Join(own, "req.1"), []byte("payload"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(Root, "stoke-test-link-"+filepath.Base(elsewhere))
	if err := os.Symlink(elsewhere, link); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(link)
	if err := RemoveRecorded(link, "stoke-test-"); err == nil {
		t.Error("RemoveRecorded followed or removed a symbolic link")
	}
	if _, err := os.Lstat(link); err != nil {
		t.Errorf("%s: %v", link, err)
	}
	if err := RemoveRecorded(own, "stoke-test-"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(own); !os.IsNotExist(err) {
		t.Errorf("%s is still there: %v", own, err)
	}
}

// The record comes before the directory: a process that dies between the
// two leaves a record of nothing, never a directory nobody knows of.
func TestMkdirRecordedRecordsFirst(t *testing.T) {
	fallback := t.TempDir()
	if !Usable() {
		dir, err := MkdirRecorded(fallback, "stoke-test-", func(string) error {
			t.Error("a directory in the fallback was recorded")
			return nil
		})
		if err != nil || filepath.Dir(dir) != fallback {
			t.Errorf("made %s (%v), want it in %s", dir, err, fallback)
		}
		return
	}
	var recorded string
	dir, err := MkdirRecorded(fallback, "stoke-test-", func(d string) error {
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
