package testbin_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"stoke.dev/stoke/internal/testbin"
)

func TestStartUp(t *testing.T) {
	defer goleak.VerifyNone(t)
	bin, cleanup, err := testbin.Stoke()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	t.Run("serves until stopped", func(t *testing.T) { servesUntilStopped(t, bin) })
	t.Run("Kill9 then Close", func(t *testing.T) { kill9ThenClose(t, bin) })
	t.Run("an early exit comes with its log", func(t *testing.T) { earlyExit(t, bin) })
}

func servesUntilStopped(t *testing.T, bin string) {
	dir := t.TempDir()
	u, err := testbin.StartUp(bin, dir)
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

func kill9ThenClose(t *testing.T, bin string) {
	u, err := testbin.StartUp(bin, t.TempDir())
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

func earlyExit(t *testing.T, bin string) {
	u, err := testbin.StartUp(bin, t.TempDir(), "--no-such-flag")
	if err == nil {
		u.Close()
		t.Fatal("StartUp with a bad flag succeeded")
	}
	if !strings.Contains(err.Error(), "exited before serving") || !strings.Contains(err.Error(), "no-such-flag") {
		t.Errorf("StartUp with a bad flag: %v", err)
	}
}
