package client_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"stoke.dev/stoke/internal/client"
)

// selfSigned writes a certificate for 127.0.0.1 and its key.
func selfSigned(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "stoke client test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func TestHTTPSWithACACertificate(t *testing.T) {
	certFile, keyFile := selfSigned(t)
	s, err := startServer(t.TempDir(), "--tls-cert", certFile, "--tls-key", keyFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.stop(); err != nil {
			t.Errorf("stoke up: %v", err)
		}
	})
	if !strings.HasPrefix(s.url, "https://") {
		t.Fatalf("server URL %s", s.url)
	}
	c, err := client.New(client.Config{Server: s.url, Token: s.token, CACertFile: certFile})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListRuntimes(t.Context(), "", client.ListOptions{}); err != nil {
		t.Errorf("list over HTTPS: %v", err)
	}
	untrusting, err := client.New(client.Config{Server: s.url, Token: s.token})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := untrusting.ListRuntimes(t.Context(), "", client.ListOptions{}); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("list without trusting the CA: %v, want a certificate error", err)
	}
	if _, err := client.New(client.Config{Server: s.url, CACertFile: keyFile}); err == nil {
		t.Error("a CA file without certificates was accepted")
	}
}
