package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"stoke.dev/stoke/internal/mtls"
)

func mustCA(t *testing.T, now time.Time) (*CA, Bundle) {
	t.Helper()
	ca, b, err := NewCA(now, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ca, b
}

func mustIssue(t *testing.T, ca *CA, role Role, now time.Time) Bundle {
	t.Helper()
	b, err := ca.Issue(role, now)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// handshake runs a real TLS handshake over loopback between a server
// holding srv and a client holding cli, each trusting the other's ca.crt
// the way runtimed and the gateway do, and returns the server's error.
func handshake(t *testing.T, srv, cli Bundle) error {
	t.Helper()
	srvCert, err := tls.X509KeyPair(srv.Cert, srv.Key)
	if err != nil {
		t.Fatal(err)
	}
	cliCert, err := tls.X509KeyPair(cli.Cert, cli.Key)
	if err != nil {
		t.Fatal(err)
	}
	srvPool, cliPool := x509.NewCertPool(), x509.NewCertPool()
	srvPool.AppendCertsFromPEM(srv.CA)
	cliPool.AppendCertsFromPEM(cli.CA)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{srvCert}, ClientCAs: srvPool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13})
		err = tc.Handshake()
		if err == nil && tc.ConnectionState().PeerCertificates[0].Subject.CommonName != mtls.GatewayName {
			err = errors.New("client CN is not the gateway's")
		}
		if err == nil {
			_, err = tc.Write([]byte("ok"))
		}
		done <- err
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{Certificates: []tls.Certificate{cliCert}, RootCAs: cliPool, ServerName: mtls.RuntimedName, MinVersion: tls.VersionTLS13})
	if err == nil {
		_, _ = io.ReadAll(c)
		c.Close()
	}
	return errors.Join(<-done, err)
}

func TestIssuedCertificatesAuthenticateBothWays(t *testing.T) {
	now := time.Now()
	ca, _ := mustCA(t, now)
	srv, cli := mustIssue(t, ca, Server, now), mustIssue(t, ca, Client, now)
	if err := ca.Check(srv, Server, now); err != nil {
		t.Errorf("server leaf: %v", err)
	}
	if err := ca.Check(cli, Client, now); err != nil {
		t.Errorf("client leaf: %v", err)
	}
	if err := handshake(t, srv, cli); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	// A client certificate from another CA is refused by the server.
	other, _ := mustCA(t, now)
	stranger := mustIssue(t, other, Client, now)
	stranger.CA = cli.CA
	if err := handshake(t, srv, stranger); err == nil {
		t.Fatal("a client certificate of another CA was accepted")
	}
	// A server certificate cannot act as the gateway's client certificate.
	if err := handshake(t, srv, srv); err == nil {
		t.Fatal("the server certificate was accepted as a client certificate")
	}
}

func TestCheckAsksForRenewal(t *testing.T) {
	now := time.Now()
	ca, _ := mustCA(t, now)
	srv := mustIssue(t, ca, Server, now)
	other, _ := mustCA(t, now)
	for _, tc := range []struct {
		name string
		ca   *CA
		b    Bundle
		role Role
		now  time.Time
		want string
	}{
		{"near its end", ca, srv, Server, now.Add(LeafLifetime - LeafRenewBefore + time.Hour), "expires in"},
		{"expired", ca, srv, Server, now.Add(LeafLifetime + time.Hour), "expired"},
		{"another CA", other, srv, Server, now, "not issued by the current CA"},
		{"wrong role", ca, srv, Client, now, "CN is"},
		{"key of another cert", ca, Bundle{CA: srv.CA, Cert: srv.Cert, Key: mustIssue(t, ca, Server, now).Key}, Server, now, "does not match"},
		{"garbage", ca, Bundle{CA: srv.CA, Cert: []byte("x"), Key: srv.Key}, Server, now, "no PEM certificate"},
		{"old bundle", ca, Bundle{CA: nil, Cert: srv.Cert, Key: srv.Key}, Server, now, "trust bundle"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.ca.Check(tc.b, tc.role, tc.now)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Check = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	if err := ca.Check(srv, Server, now.Add(LeafLifetime-LeafRenewBefore-time.Hour)); err != nil {
		t.Fatalf("a leaf with more than LeafRenewBefore left: %v", err)
	}
}

// A renewed CA keeps the one it replaces in its trust bundle, so that a
// leaf issued by the old CA and one issued by the new authenticate each
// other while the Secrets catch up.
func TestRenewedCATrustsTheOldOneUntilItExpires(t *testing.T) {
	// The handshake checks validity against the real clock: the old CA
	// was made long ago, the new one now.
	now := time.Now()
	oldCA, _ := mustCA(t, now.Add(-(CALifetime - CARenewBefore + time.Hour)))
	if !oldCA.NeedsRenewal(now) || oldCA.NeedsRenewal(now.Add(-2*time.Hour)) {
		t.Fatal("NeedsRenewal disagrees with CARenewBefore")
	}
	newCA, b, err := NewCA(now, oldCA.Cert)
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := ParseCA(b, now)
	if err != nil {
		t.Fatal(err)
	}
	if string(parsed.Trust) != string(newCA.Trust) || strings.Count(string(parsed.Trust), "BEGIN CERTIFICATE") != 2 {
		t.Fatalf("trust bundle after renewal has %d certificates, want 2", strings.Count(string(parsed.Trust), "BEGIN CERTIFICATE"))
	}
	oldSrv := mustIssue(t, oldCA, Server, now)
	oldSrv.CA = newCA.Trust // the Secret has its new ca.crt, the Pod not yet its new leaf
	newCli := mustIssue(t, newCA, Client, now)
	if err := handshake(t, oldSrv, newCli); err != nil {
		t.Fatalf("old server leaf, new client leaf: %v", err)
	}
	if err := newCA.Check(oldSrv, Server, now); err == nil {
		t.Fatal("Check accepted a leaf of the replaced CA")
	}
	// Once the old CA has expired, reading the Secret drops it.
	parsed, err = ParseCA(b, oldCA.Cert.NotAfter.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(parsed.Trust), "BEGIN CERTIFICATE"); n != 1 {
		t.Fatalf("trust bundle after the old CA expired has %d certificates, want 1", n)
	}
}

func TestParseCARejectsALeaf(t *testing.T) {
	now := time.Now()
	ca, _ := mustCA(t, now)
	if _, err := ParseCA(mustIssue(t, ca, Server, now), now); err == nil {
		t.Fatal("ParseCA accepted a leaf")
	}
}
