package up_test

import (
	"crypto/tls"
	"net/http"
	"strings"
	"testing"

	"stoke.dev/stoke/internal/testtls"
	"stoke.dev/stoke/internal/up"
)

func TestServesHTTPSWithTheGivenCertificate(t *testing.T) {
	certFile, keyFile, roots := testtls.SelfSigned(t)
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
