package client_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/datadir"
	"stoke.dev/stoke/internal/errdefs"
)

func TestResolve(t *testing.T) {
	dataDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dataDir, "token"), []byte("file-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	envDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(envDir, "token"), []byte("env-dir-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stateHome := t.TempDir()
	if err := os.MkdirAll(filepath.Join(stateHome, "stoke"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stateHome, "stoke", "token"), []byte("default-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("XDG_STATE_HOME", stateHome) // what datadir.Default reads
	urlDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(urlDir, "token"), []byte("url-dir-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := datadir.WriteURL(urlDir, "https://127.0.0.1:9443"); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name             string
		flags            client.Settings
		env              map[string]string
		server, token    string
		caCert           string
		wantErrSubstring string
	}{
		{name: "defaults", server: "http://127.0.0.1:7070", token: "default-token"},
		{name: "flags win", flags: client.Settings{Server: "https://a:1", Token: "t", CACert: "ca.pem"},
			env:    map[string]string{"STOKE_SERVER": "http://b:2", "STOKE_TOKEN": "e", "STOKE_CA_CERT": "x.pem"},
			server: "https://a:1", token: "t", caCert: "ca.pem"},
		{name: "environment", env: map[string]string{"STOKE_SERVER": "http://b:2", "STOKE_TOKEN": "e", "STOKE_CA_CERT": "x.pem"},
			server: "http://b:2", token: "e", caCert: "x.pem"},
		{name: "data dir flag", flags: client.Settings{DataDir: dataDir}, env: map[string]string{"STOKE_DATA_DIR": envDir},
			server: "http://127.0.0.1:7070", token: "file-token"},
		{name: "data dir environment", env: map[string]string{"STOKE_DATA_DIR": envDir}, server: "http://127.0.0.1:7070", token: "env-dir-token"},
		{name: "URL recorded by stoke up", flags: client.Settings{DataDir: urlDir}, server: "https://127.0.0.1:9443", token: "url-dir-token"},
		{name: "flag beats the recorded URL", flags: client.Settings{DataDir: urlDir, Server: "http://c:3"}, server: "http://c:3", token: "url-dir-token"},
		{name: "no token file", flags: client.Settings{DataDir: filepath.Join(dataDir, "missing")},
			wantErrSubstring: filepath.Join(dataDir, "missing", "token")},
		{name: "bad server", flags: client.Settings{Server: "ftp://x", Token: "t"}, wantErrSubstring: "http or https"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := client.Resolve(tc.flags, func(k string) string { return tc.env[k] })
			if tc.wantErrSubstring != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErrSubstring) {
					t.Fatalf("Resolve = %v, want an error containing %q", err, tc.wantErrSubstring)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Server != tc.server || cfg.Token != tc.token || cfg.CACertFile != tc.caCert {
				t.Errorf("Resolve = %+v, want server %q token %q ca %q", cfg, tc.server, tc.token, tc.caCert)
			}
		})
	}
}

func TestResolveWithoutTokenIsUnauthenticated(t *testing.T) {
	_, err := client.Resolve(client.Settings{DataDir: t.TempDir()}, func(string) string { return "" })
	if !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), "stoke up") {
		t.Errorf("Resolve = %v", err)
	}
}

func TestParseServerURL(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:7070":                "http://127.0.0.1:7070",
		"http://h:1/":                   "http://h:1",
		"https://stoke.example/prefix/": "https://stoke.example/prefix",
	} {
		u, err := client.ParseServerURL(in)
		if err != nil || u.String() != want {
			t.Errorf("ParseServerURL(%q) = %v, %v; want %s", in, u, err, want)
		}
	}
	for _, bad := range []string{"", "ftp://h", "http://", "http://h/?q=1", "http://u:p@h"} {
		if _, err := client.ParseServerURL(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ParseServerURL(%q) = %v, want InvalidArgument", bad, err)
		}
	}
}
