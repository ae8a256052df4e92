package cpuprofile

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestOffWithoutTheVariable(t *testing.T) {
	t.Setenv(EnvVar, "")
	stop, err := Start("up")
	if err != nil {
		t.Fatal(err)
	}
	stop()
}

func TestRefusesADirectoryOthersCanUse(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvVar, dir)
	if _, err := Start("up"); err == nil || !strings.Contains(err.Error(), "chmod 700") {
		t.Fatalf("Start in a 0755 directory: %v, want a refusal that says how to fix it", err)
	}
}

func TestWritesOneProfilePerProcess(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvVar, dir)
	stop, err := Start("runtime-server")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	fi, err := os.Stat(filepath.Join(dir, fmt.Sprintf("runtime-server-%d.pprof", os.Getpid())))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("profile: %d bytes, mode %v; want a non-empty file of mode 0600", fi.Size(), fi.Mode().Perm())
	}
}
