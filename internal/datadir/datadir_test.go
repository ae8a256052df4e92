package datadir

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

func TestEnsureTokenCreatesOnceWithMode0600(t *testing.T) {
	dir := t.TempDir() + "/data"
	tok, err := EnsureToken(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(tok) != 64 {
		t.Errorf("token %q: want 64 hex characters", tok)
	}
	fi, err := os.Stat(TokenPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("token file mode %v, want 0600", fi.Mode().Perm())
	}
	again, err := EnsureToken(dir)
	if err != nil || again != tok {
		t.Errorf("second start: %q, %v; want the same token %q", again, err, tok)
	}
	if read, err := ReadToken(dir); err != nil || read != tok {
		t.Errorf("ReadToken = %q, %v", read, err)
	}
}

func TestEnsureTokenRefusesAWorldReadableFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(TokenPath(dir), []byte("secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureToken(dir); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("EnsureToken = %v; want a refusal naming chmod 600", err)
	}
}

func TestDefaultFollowsXDGStateHome(t *testing.T) {
	t.Setenv("XDG_STATE_HOME", "/x/state")
	if d, err := Default(); err != nil || d != "/x/state/stoke" {
		t.Errorf("Default = %q, %v", d, err)
	}
	t.Setenv("XDG_STATE_HOME", "")
	t.Setenv("HOME", "/home/u")
	if d, err := defaultFor(1000); err != nil || d != "/home/u/.local/state/stoke" {
		t.Errorf("Default = %q, %v", d, err)
	}
	// Root's Runs run as a user that cannot pass through root's home.
	if d, err := defaultFor(0); err != nil || d != System {
		t.Errorf("Default for root = %q, %v; want %s", d, err, System)
	}
}

func TestPrepareCreatesAPrivateDirectory(t *testing.T) {
	dir := t.TempDir() + "/a/data"
	if err := Prepare(dir, nil); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("stat %s: %v %v, want mode 0700", dir, fi.Mode().Perm(), err)
	}
	if err := Prepare(dir, nil); err != nil {
		t.Errorf("second Prepare of a private directory: %v", err)
	}
}

func TestPrepareRefusesADirectoryOthersCanUse(t *testing.T) {
	for _, mode := range []os.FileMode{0o755, 0o750, 0o770, 0o701, 0o702, 0o704, 0o710, 0o720, 0o740} {
		dir := t.TempDir()
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
		err := Prepare(dir, nil)
		if err == nil || !strings.Contains(err.Error(), "chmod 700 "+dir) {
			t.Errorf("mode %#o: Prepare = %v; want a refusal that says chmod 700 %s", mode, err, dir)
		}
	}
}

func TestPrepareRefusesADirectoryOfAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		// Only root can give a directory away; as another user, /
		// belongs to root.
		if err := Prepare("/", nil); err == nil || !strings.Contains(err.Error(), "belongs to uid 0") {
			t.Fatalf("Prepare(/) = %v; want a refusal naming its owner", err)
		}
		return
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := Prepare(dir, nil); err == nil || !strings.Contains(err.Error(), "belongs to uid 65534") {
		t.Fatalf("Prepare = %v; want a refusal naming uid 65534", err)
	}
}

func TestLockNamesTheHolder(t *testing.T) {
	dir := t.TempDir()
	release, err := Lock(dir)
	if err != nil {
		t.Fatal(err)
	}
	// flock locks belong to the open file description: a second open in
	// this process conflicts as another process's would.
	_, err = Lock(dir)
	want := fmt.Sprintf("another stoke up (pid %d) serves this data directory (%s)", os.Getpid(), dir)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("second Lock = %v; want %q", err, want)
	}
	release()
	again, err := Lock(dir)
	if err != nil {
		t.Fatalf("Lock after release: %v", err)
	}
	again()
}
