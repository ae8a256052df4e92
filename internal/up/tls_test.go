package up_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"stoke.dev/stoke/internal/up"
)

// selfSigned writes a certificate for 127.0.0.1 and its key, and returns
// their paths and a pool trusting the certificate.
func selfSigned(t *testing.T) (certFile, keyFile string, roots *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "stoke test"},
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
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots = x509.NewCertPool()
	roots.AddCert(cert)
	return certFile, keyFile, roots
}

func TestServesHTTPSWithTheGivenCertificate(t *testing.T) {
	certFile, keyFile, roots := selfSigned(t)
	s := startUp(t, func(c *up.Config) { c.TLSCert, c.TLSKey = certFile, keyFile })
	if !strings.HasPrefix(s.url, "https://") {
		t.Fatalf("url %s, want https", s.url)
	}
	s.client.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}
	if r := s.do(t, http.MethodGet, "/v1/namespaces/default/runtimes/bash", "", nil); r.status != http.StatusOK {
		t.Errorf("get over TLS: %s", r)
	}
	plain := &http.Client{Transport: &http.Transport{}}
	defer plain.CloseIdleConnections()
	resp, err := plain.Get("http://" + strings.TrimPrefix(s.url, "https://") + "/healthz")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("plain HTTP answered 200 on the TLS port")
		}
	}
}

func TestRefusesHalfATLSConfiguration(t *testing.T) {
	err := up.Run(t.Context(), up.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", TLSCert: "cert.pem"})
	if err == nil || !strings.Contains(err.Error(), "--tls-key") {
		t.Errorf("Run = %v; want an error naming --tls-key", err)
	}
}
