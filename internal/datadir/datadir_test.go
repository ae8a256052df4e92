package datadir

import (
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
	if d, err := Default(); err != nil || d != "/home/u/.local/state/stoke" {
		t.Errorf("Default = %q, %v", d, err)
	}
}
