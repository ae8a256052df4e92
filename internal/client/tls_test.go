package client_test

import (
	"strings"
	"testing"

	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/testtls"
)

func TestHTTPSWithACACertificate(t *testing.T) {
	certFile, keyFile, _ := testtls.SelfSigned(t)
	s, err := startServer(t.TempDir(), "--tls-cert", certFile, "--tls-key", keyFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Error(err)
		}
	})
	if !strings.HasPrefix(s.URL, "https://") {
		t.Fatalf("server URL %s", s.URL)
	}
	c, err := client.New(client.Config{Server: s.URL, Token: s.Token, CACertFile: certFile})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListRuntimes(t.Context(), "", client.ListOptions{}); err != nil {
		t.Errorf("list over HTTPS: %v", err)
	}
	untrusting, err := client.New(client.Config{Server: s.URL, Token: s.Token})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := untrusting.ListRuntimes(t.Context(), "", client.ListOptions{}); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("list without trusting the CA: %v, want a certificate error", err)
	}
	if _, err := client.New(client.Config{Server: s.URL, CACertFile: keyFile}); err == nil {
		t.Error("a CA file without certificates was accepted")
	}
}
