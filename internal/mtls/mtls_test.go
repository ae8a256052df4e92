package mtls_test

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"stoke.dev/stoke/internal/mtls"
	"stoke.dev/stoke/internal/pki"
	"stoke.dev/stoke/internal/testtls"
)

// serve runs a gRPC health server with runtimed's credentials from dir on
// a loopback port and returns its address.
func serve(t *testing.T, dir string) string {
	t.Helper()
	cfg, err := mtls.ServerConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	healthpb.RegisterHealthServer(s, health.NewServer())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(lis)
	}()
	t.Cleanup(func() {
		s.Stop()
		<-done
	})
	return lis.Addr().String()
}

// check makes one health call over a new connection with cfg.
func check(t *testing.T, addr string, cfg *tls.Config) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

func clientConfig(t *testing.T, dir string) *tls.Config {
	t.Helper()
	cfg, err := mtls.ClientConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func wantRefused(t *testing.T, err error, what string) {
	t.Helper()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("%s: got %v, want the connection refused (Unavailable)", what, err)
	}
	if testing.Verbose() {
		t.Logf("%s: %v", what, err)
	}
}

func TestServerAcceptsOnlyTheGateway(t *testing.T) {
	root := t.TempDir()
	ca := testtls.NewCA(t)
	srvDir := ca.Issue(t, filepath.Join(root, "runtimed"), testtls.Leaf{CommonName: "runtimed", DNSNames: []string{mtls.RuntimedName}})
	gwDir := ca.Issue(t, filepath.Join(root, "gateway"), testtls.Leaf{CommonName: mtls.GatewayName, Client: true})
	addr := serve(t, srvDir)

	if err := check(t, addr, clientConfig(t, gwDir)); err != nil {
		t.Fatalf("the gateway's certificate: %v", err)
	}

	// No client certificate at all.
	noCert := clientConfig(t, gwDir)
	noCert.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &tls.Certificate{}, nil }
	wantRefused(t, check(t, addr, noCert), "no client certificate")

	// CN stoke-gateway, but signed by another CA.
	other := testtls.NewCA(t)
	otherDir := other.Issue(t, filepath.Join(root, "other"), testtls.Leaf{CommonName: mtls.GatewayName, Client: true})
	foreign := clientConfig(t, otherDir)
	foreign.VerifyConnection = clientConfig(t, gwDir).VerifyConnection // trust the server, present the foreign cert
	wantRefused(t, check(t, addr, foreign), "a certificate from another CA")

	// The right CA, the wrong name.
	wrongDir := ca.Issue(t, filepath.Join(root, "wrong"), testtls.Leaf{CommonName: "someone-else", Client: true})
	wantRefused(t, check(t, addr, clientConfig(t, wrongDir)), "a certificate for another name")

	// The server's own certificate is a server certificate, not a client one.
	wantRefused(t, check(t, addr, clientConfig(t, srvDir)), "a server certificate used as a client's")

	// TLS 1.2 is refused even with the gateway's certificate.
	old := clientConfig(t, gwDir)
	old.MinVersion, old.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	wantRefused(t, check(t, addr, old), "TLS 1.2")
}

func TestClientVerifiesTheServer(t *testing.T) {
	root := t.TempDir()
	ca := testtls.NewCA(t)
	gwDir := ca.Issue(t, filepath.Join(root, "gateway"), testtls.Leaf{CommonName: mtls.GatewayName, Client: true})

	// A server for another name, from the right CA.
	wrongName := ca.Issue(t, filepath.Join(root, "wrong-name"), testtls.Leaf{CommonName: "x", DNSNames: []string{"stoke-elsewhere"}})
	err := check(t, serve(t, wrongName), clientConfig(t, gwDir))
	wantRefused(t, err, "a server certificate for another name")
	if !strings.Contains(err.Error(), mtls.RuntimedName) {
		t.Errorf("the error does not say which name was expected: %v", err)
	}

	// The right name from another CA (its own ca.crt trusts it, ours does not).
	other := testtls.NewCA(t)
	foreign := other.Issue(t, filepath.Join(root, "foreign"), testtls.Leaf{CommonName: "x", DNSNames: []string{mtls.RuntimedName}})
	wantRefused(t, check(t, serve(t, foreign), clientConfig(t, gwDir)), "a server certificate from another CA")
}

func TestRotatedCredentialsAreUsedByNewConnections(t *testing.T) {
	root := t.TempDir()
	srvDir, gwDir := filepath.Join(root, "runtimed"), filepath.Join(root, "gateway")
	ca := testtls.NewCA(t)
	ca.Issue(t, srvDir, testtls.Leaf{CommonName: "runtimed", DNSNames: []string{mtls.RuntimedName}})
	ca.Issue(t, gwDir, testtls.Leaf{CommonName: mtls.GatewayName, Client: true})
	addr := serve(t, srvDir)
	client := clientConfig(t, gwDir)
	if err := check(t, addr, client); err != nil {
		t.Fatal(err)
	}
	// Keep a copy of the gateway's old credentials.
	oldDir := ca.Issue(t, filepath.Join(root, "old-gateway"), testtls.Leaf{CommonName: mtls.GatewayName, Client: true})

	// A new CA for both sides, as a rotated Secret would bring.
	next := testtls.NewCA(t)
	next.Issue(t, srvDir, testtls.Leaf{CommonName: "runtimed", DNSNames: []string{mtls.RuntimedName}})
	next.Issue(t, gwDir, testtls.Leaf{CommonName: mtls.GatewayName, Client: true})
	if err := check(t, addr, client); err != nil {
		t.Fatalf("after rotation, the same client config: %v", err)
	}
	stale := clientConfig(t, oldDir)
	stale.VerifyConnection = client.VerifyConnection // trust the server, present the old CA's cert
	wantRefused(t, check(t, addr, stale), "a client certificate of the old CA")
}

func TestLoadFailsClearly(t *testing.T) {
	dir := t.TempDir()
	if _, err := mtls.ServerConfig(dir); err == nil || !strings.Contains(err.Error(), mtls.CAFile) {
		t.Fatalf("empty directory: %v", err)
	}
	ca := testtls.NewCA(t)
	ca.Issue(t, dir, testtls.Leaf{CommonName: mtls.GatewayName, Client: true})
	other := t.TempDir()
	testtls.NewCA(t).Issue(t, other, testtls.Leaf{CommonName: mtls.GatewayName, Client: true})
	// A key that does not match the certificate.
	if err := copyFile(filepath.Join(other, mtls.KeyFile), filepath.Join(dir, mtls.KeyFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := mtls.ClientConfig(dir); err == nil || !strings.Contains(err.Error(), mtls.KeyFile) {
		t.Fatalf("mismatched key: %v", err)
	}
}

func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, data, 0o600)
}

// The certificates the controller issues (internal/pki) are the ones this
// package accepts.
func TestCertificatesOfTheControllersCA(t *testing.T) {
	now := time.Now()
	ca, _, err := pki.NewCA(now, nil)
	if err != nil {
		t.Fatal(err)
	}
	write := func(role pki.Role) string {
		b, err := ca.Issue(role, now)
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		for name, data := range map[string][]byte{mtls.CAFile: b.CA, mtls.CertFile: b.Cert, mtls.KeyFile: b.Key} {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	if err := check(t, serve(t, write(pki.Server)), clientConfig(t, write(pki.Client))); err != nil {
		t.Fatalf("the controller's gateway and runtimed certificates: %v", err)
	}
}
