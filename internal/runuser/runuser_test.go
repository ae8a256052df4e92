package runuser

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]string{"1000": "1000:1000", "1000:100": "1000:100", "65533:65533": "65533:65533"} {
		u, err := Parse(in)
		if err != nil || u.String() != want {
			t.Errorf("Parse(%q) = %v, %v; want %s", in, u, err, want)
		}
	}
	for _, in := range []string{"", "0", "0:100", "100:0", "x", "1:y", "-1", "4294967295", "1:2:3"} {
		if u, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) = %v; want an error", in, u)
		}
	}
}

func TestNilUserChangesNothing(t *testing.T) {
	var u *User
	dir := filepath.Join(t.TempDir(), "d")
	if err := u.Passage(dir); err != nil {
		t.Fatal(err)
	}
	if err := u.Give(dir); err != nil {
		t.Fatal(err)
	}
	if st := stat(t, dir); st.Mode&0o777 != 0o700 || int(st.Uid) != os.Geteuid() {
		t.Errorf("mode %#o owner %d; want 0700, ours", st.Mode&0o777, st.Uid)
	}
	if u.Credential() != nil || u.String() != "" || u.Reaches("/root") != nil {
		t.Error("a nil user is not this process")
	}
}

// Give hands over a tree the server made, its top last, without following
// a symbolic link out of it; a tree that is the user's already is left
// alone. Passage is 0710 with the user's group. Only root can chown.
func TestGiveAndPassage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Log("only root changes owners; checking the refusal instead")
		if err := (&User{UID: 65533, GID: 65533}).Mkdir(filepath.Join(t.TempDir(), "d")); err == nil {
			t.Error("a non-root process gave a directory away")
		}
		return
	}
	u := &User{UID: 65533, GID: 65532}
	root := t.TempDir()
	// t.TempDir's parent is 0700.
	if err := os.Chmod(filepath.Dir(root), 0o711); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(root, "outside")
	if err := os.WriteFile(outside, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "work")
	for _, d := range []string{"", "a", "a/b"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "a/b/f"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "a/link")); err != nil {
		t.Fatal(err)
	}
	if err := u.Give(dir); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"", "a", "a/b", "a/b/f"} {
		if st := stat(t, filepath.Join(dir, p)); st.Uid != u.UID || st.Gid != u.GID {
			t.Errorf("%s: owner %d:%d; want %s", p, st.Uid, st.Gid, u)
		}
	}
	var lst syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(dir, "a/link"), &lst); err != nil || lst.Uid != u.UID {
		t.Errorf("the link itself: owner %d (%v); want the user's", lst.Uid, err)
	}
	if st := stat(t, outside); st.Uid != 0 {
		t.Errorf("the link's target was handed over too (owner %d)", st.Uid)
	}
	// Given already: what is inside is the user's business; not walked.
	if err := os.Chown(filepath.Join(dir, "a/b/f"), 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := u.Give(dir); err != nil {
		t.Fatal(err)
	}
	if st := stat(t, filepath.Join(dir, "a/b/f")); st.Uid != 0 {
		t.Errorf("a tree that was the user's already was walked again")
	}

	pass := filepath.Join(root, "pass")
	if err := u.Passage(pass); err != nil {
		t.Fatal(err)
	}
	if st := stat(t, pass); st.Mode&0o777 != 0o710 || st.Uid != 0 || st.Gid != u.GID {
		t.Errorf("passage: mode %#o owner %d:%d; want 0710 root:%d", st.Mode&0o777, st.Uid, st.Gid, u.GID)
	}
	if err := u.Reaches(pass); err != nil {
		t.Errorf("the user cannot pass its passage: %v", err)
	}
	if err := os.Chmod(root, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := u.Reaches(pass); err == nil || !strings.Contains(err.Error(), root) {
		t.Errorf("Reaches through a 0700 directory of root's: %v; want a refusal naming %s", err, root)
	}
}

func stat(t *testing.T, p string) *syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return &st
}
