package debugsock

import (
	"bytes"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestServeAndFetch(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "debug.sock")
	s, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("socket directory mode %v (%v), want 0700", fi.Mode().Perm(), err)
	}

	var g bytes.Buffer
	if err := Fetch(t.Context(), sock, "goroutine", url.Values{"debug": {"1"}}, &g); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(g.String(), "debugsock.TestServeAndFetch") {
		t.Fatalf("the goroutine dump does not show this test:\n%s", g.String())
	}

	var cpu bytes.Buffer
	if err := Fetch(t.Context(), sock, "profile", url.Values{"seconds": {"1"}}, &cpu); err != nil {
		t.Fatal(err)
	}
	if b := cpu.Bytes(); len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Fatalf("the CPU profile is not gzipped protobuf: % x", b[:min(len(b), 8)])
	}

	if err := Fetch(t.Context(), sock, "nosuch", nil, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("an unknown profile: %v, want a 404", err)
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := Fetch(t.Context(), sock, "goroutine", nil, &bytes.Buffer{}); err == nil {
		t.Fatal("Fetch after Close succeeded")
	}
}

func TestListenRefusesAPathItCannotUse(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(filepath.Join(file, "debug.sock")); err == nil || !strings.Contains(err.Error(), "debug socket") {
		t.Fatalf("Listen under a file: %v", err)
	}
}
