package kubegateway

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	certutil "k8s.io/client-go/util/cert"
)

// secretVolume writes a kubernetes.io/tls Secret's files as the kubelet
// mounts them: tls.crt and tls.key link into ..data, itself a link to a
// directory of the current contents, which an update replaces by
// swapping ..data (a rename) and removing the old directory.
type secretVolume struct {
	t   *testing.T
	dir string
	gen int
}

func (v *secretVolume) write(host string) {
	v.t.Helper()
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(host, nil, nil)
	if err != nil {
		v.t.Fatal(err)
	}
	v.gen++
	ts := filepath.Join(v.dir, "..2026_12_06_"+string(rune('a'+v.gen)))
	if err := os.Mkdir(ts, 0o755); err != nil {
		v.t.Fatal(err)
	}
	for name, data := range map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM} {
		if err := os.WriteFile(filepath.Join(ts, name), data, 0o600); err != nil {
			v.t.Fatal(err)
		}
	}
	old, _ := os.Readlink(filepath.Join(v.dir, "..data"))
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		v.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		v.t.Fatal(err)
	}
	for _, name := range []string{"tls.crt", "tls.key"} {
		if _, err := os.Lstat(filepath.Join(v.dir, name)); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), filepath.Join(v.dir, name)); err != nil {
				v.t.Fatal(err)
			}
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(v.dir, old)); err != nil {
			v.t.Fatal(err)
		}
	}
}

// servedName is the common name of the certificate a TLS handshake with
// addr is answered with.
func servedName(t *testing.T, addr string) string {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// certutil names a self-signed certificate host@timestamp.
	name, _, _ := strings.Cut(conn.ConnectionState().PeerCertificates[0].Subject.CommonName, "@")
	return name
}

// The serving certificate follows its Secret's files as the kubelet
// updates them in place: new connections get the new certificate without
// a restart, and a pair that does not load leaves the previous one
// serving.
func TestServingCertificateFollowsTheSecret(t *testing.T) {
	v := &secretVolume{t: t, dir: t.TempDir()}
	v.write("first.example")
	certFile, keyFile := filepath.Join(v.dir, "tls.crt"), filepath.Join(v.dir, "tls.key")
	cfg, cert, err := servingConfig(certFile, keyFile, false, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if cert == nil {
		t.Fatal("a certificate from files is not watched")
	}
	lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
			}(c)
		}
	}()
	if got := servedName(t, lis.Addr().String()); got != "first.example" {
		t.Fatalf("served %q, want first.example", got)
	}

	<-cert.loaded // the first load
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		cert.Run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()

	v.write("second.example")
	awaitLoaded(t, cert)
	if got := servedName(t, lis.Addr().String()); got != "second.example" {
		t.Fatalf("after the Secret changed, served %q, want second.example", got)
	}

	// A key that does not match its certificate is not taken.
	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "k"), mustKey(t), 0o600); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(other, "k"))
	if err != nil {
		t.Fatal(err)
	}
	target, err := filepath.EvalSymlinks(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(target, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := servedName(t, lis.Addr().String()); got != "second.example" {
		t.Fatalf("after a mismatched key, served %q, want second.example still", got)
	}
	// The next good pair is taken.
	v.write("third.example")
	awaitLoaded(t, cert)
	if got := servedName(t, lis.Addr().String()); got != "third.example" {
		t.Fatalf("served %q, want third.example", got)
	}
}

func awaitLoaded(t *testing.T, sc *servingCert) {
	t.Helper()
	select {
	case <-sc.loaded:
	case <-time.After(30 * time.Second):
		t.Fatal("the changed certificate was not loaded")
	}
}

func mustKey(t *testing.T) []byte {
	t.Helper()
	_, keyPEM, err := certutil.GenerateSelfSignedCertKey("unrelated.example", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return keyPEM
}
