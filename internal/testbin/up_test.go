package testbin_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"stoke.dev/stoke/internal/testbin"
)

var stokeBin string

func TestMain(m *testing.M) {
	bin, cleanup, err := testbin.Stoke()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	stokeBin = bin
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { cleanup() }))
}

func TestStartUpServesUntilStopped(t *testing.T) {
	dir := t.TempDir()
	u, err := testbin.StartUp(stokeBin, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if !strings.HasPrefix(u.URL, "http://127.0.0.1:") || u.DataDir != dir || u.Pid != u.Cmd.Process.Pid {
		t.Errorf("URL %q, DataDir %q, Pid %d", u.URL, u.DataDir, u.Pid)
	}
	if tok, err := os.ReadFile(filepath.Join(dir, "token")); err != nil || strings.TrimSpace(string(tok)) != u.Token || u.Token == "" {
		t.Errorf("Token %q, token file %q (%v)", u.Token, tok, err)
	}
	resp, err := http.Get(u.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /healthz: %s", resp.Status)
	}
	if err := u.Stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-u.Exited():
	default:
		t.Error("Exited is open after Stop")
	}
	if err := u.Wait(); err != nil {
		t.Errorf("Wait after Stop: %v", err)
	}
	if len(u.Log()) == 0 {
		t.Error("no log kept")
	}
	if err := u.Close(); err != nil {
		t.Errorf("Close after Stop: %v", err)
	}
}

func TestKill9ThenClose(t *testing.T) {
	u, err := testbin.StartUp(stokeBin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := u.Kill9(); err != nil {
		t.Fatal(err)
	}
	if err := u.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("Wait after Kill9: %v, want killed", err)
	}
	for range 2 {
		if err := u.Close(); err != nil {
			t.Errorf("Close after Kill9: %v", err)
		}
	}
}

func TestStartUpReportsAnEarlyExitWithItsLog(t *testing.T) {
	u, err := testbin.StartUp(stokeBin, t.TempDir(), "--no-such-flag")
	if err == nil {
		u.Close()
		t.Fatal("StartUp with a bad flag succeeded")
	}
	if !strings.Contains(err.Error(), "exited before serving") || !strings.Contains(err.Error(), "no-such-flag") {
		t.Errorf("StartUp with a bad flag: %v", err)
	}
}
