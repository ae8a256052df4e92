package kubetest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// A ca signs the certificates of one trust domain of the test cluster: the
// cluster's (the API server's serving certificate and every client's) or
// etcd's (etcd's own and the API server's etcd client certificate), as
// kubeadm keeps them apart.
type ca struct {
	cert *x509.Certificate
	key  crypto.Signer
	pem  []byte
}

// Certificates are valid for a day either side of now: longer than any test
// binary runs, short enough to be worthless after.
const certValidity = 24 * time.Hour

func newCA(name string) (*ca, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-certValidity),
		NotAfter:              time.Now().Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &ca{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// A keyPair is a certificate and its key, PEM-encoded.
type keyPair struct{ cert, key []byte }

// issue signs a certificate for a server on 127.0.0.1 (server true) or for
// a client named cn in the groups orgs (Kubernetes reads the user from CN
// and the groups from O).
func (c *ca) issue(cn string, orgs []string, server bool) (keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return keyPair{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    time.Now().Add(-certValidity),
		NotAfter:     time.Now().Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		// etcd's peer listener also dials itself as a client.
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, key.Public(), c.key)
	if err != nil {
		return keyPair{}, err
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return keyPair{}, err
	}
	return keyPair{cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: keyPEM}, nil
}

// IssueClientCert signs a client certificate with the cluster's CA, which
// the API server (and anything that trusts its client-ca-file, as the
// kube-system/extension-apiserver-authentication ConfigMap publishes it)
// authenticates as the user cn in the groups orgs: a kubeconfig user's
// certificate, as kubeadm makes them. It returns the PEM certificate and
// key.
func (c *Cluster) IssueClientCert(cn string, orgs ...string) (certPEM, keyPEM []byte, err error) {
	p, err := c.clientCA.issue(cn, orgs, false)
	return p.cert, p.key, err
}

// write stores the pair as dir/name.crt and dir/name.key (mode 0600) and
// returns their paths.
func (p keyPair) write(dir, name string) (certFile, keyFile string, err error) {
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(certFile, p.cert, 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyFile, p.key, 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// writeServiceAccountKey writes a new service-account signing key
// (dir/sa.key, for the API server's --service-account-signing-key-file and
// the controller-manager's --service-account-private-key-file) and its
// public key (dir/sa.pub, for --service-account-key-file).
func writeServiceAccountKey(dir string) (keyFile, pubFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return "", "", err
	}
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return "", "", err
	}
	keyFile, pubFile = filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600); err != nil {
		return "", "", err
	}
	return keyFile, pubFile, nil
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}
