// Package pki is Stoke's own certificate authority in Kubernetes mode: the
// controller keeps a CA in the Secret stoke-ca of its namespace and issues
// from it the mTLS credentials of runtimed's invoke and exec hop — a server
// certificate for the DNS name stoke-runtimed in the Secret
// stoke-runtimed-tls of each Runtime namespace, and a client certificate
// with CN stoke-gateway in the Secret stoke-gateway-tls of the controller's
// namespace, which only the gateway mounts. Every Secret holds ca.crt,
// tls.crt and tls.key (PEM); keys are ECDSA P-256.
//
// Lifetimes: the CA lives CALifetime and is replaced when less than
// CARenewBefore remains; a replaced CA stays in every ca.crt until it
// expires, so that peers holding old and new credentials trust each other
// while the Secret volumes catch up. A leaf lives LeafLifetime and is
// re-issued when less than LeafRenewBefore remains, when it no longer
// chains to the current CA, or when it does not say what it is for.
package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"

	"stoke.dev/stoke/internal/mtls"
)

// Lifetimes of what the CA holds and issues.
const (
	CALifetime      = 10 * 365 * 24 * time.Hour
	CARenewBefore   = 365 * 24 * time.Hour
	LeafLifetime    = 90 * 24 * time.Hour
	LeafRenewBefore = 30 * 24 * time.Hour
	// backdate covers clocks a little behind the issuer's.
	backdate = 5 * time.Minute
)

// Names the certificates carry, besides mtls.RuntimedName (runtimed's
// server certificate) and mtls.GatewayName (the gateway's client
// certificate), which the hop checks.
const (
	CACommonName = "stoke-ca"
)

// Keys of every Secret this package writes (those of kubernetes.io/tls,
// plus the CA bundle).
const (
	KeyCA   = "ca.crt"
	KeyCert = "tls.crt"
	KeyKey  = "tls.key"
)

// Role is what a leaf certificate is for.
type Role int

// Leaf roles.
const (
	// Server is runtimed's hop: DNS name mtls.RuntimedName.
	Server Role = iota
	// Client is the gateway: CN mtls.GatewayName.
	Client
)

// Bundle is PEM data as stored in a Secret.
type Bundle struct {
	// CA is the trust bundle: the current CA first, then a replaced one
	// that has not expired yet.
	CA   []byte
	Cert []byte
	Key  []byte
}

// CA is a parsed certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// Trust is the PEM bundle leaves carry as ca.crt.
	Trust []byte
}

// NewCA makes a self-signed CA valid from now for CALifetime. previous,
// when it is a CA certificate that has not expired, stays in the trust
// bundle.
func NewCA(now time.Time, previous *x509.Certificate) (*CA, Bundle, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, Bundle{}, fmt.Errorf("CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, Bundle{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: CACommonName},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(CALifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, Bundle{}, fmt.Errorf("CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, Bundle{}, fmt.Errorf("CA certificate: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, Bundle{}, err
	}
	certPEM := encodeCert(der)
	trust := bytes.Clone(certPEM)
	if previous != nil && previous.IsCA && now.Before(previous.NotAfter) {
		trust = append(trust, encodeCert(previous.Raw)...)
	}
	ca := &CA{Cert: cert, Key: key, Trust: trust}
	return ca, Bundle{CA: trust, Cert: certPEM, Key: keyPEM}, nil
}

// ParseCA reads a CA from its Secret's data; its trust bundle keeps, after
// the CA itself, the bundle's other certificates that have not expired at
// now.
func ParseCA(b Bundle, now time.Time) (*CA, error) {
	certs, err := parseCerts(b.Cert)
	if err != nil {
		return nil, fmt.Errorf("CA %s: %w", KeyCert, err)
	}
	key, err := parseKey(b.Key)
	if err != nil {
		return nil, fmt.Errorf("CA %s: %w", KeyKey, err)
	}
	cert := certs[0]
	if !cert.IsCA || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("CA: tls.crt is not a CA certificate for tls.key")
	}
	trust := encodeCert(cert.Raw)
	if others, err := parseCerts(b.CA); err == nil {
		for _, c := range others {
			if c.IsCA && !c.Equal(cert) && now.Before(c.NotAfter) {
				trust = append(trust, encodeCert(c.Raw)...)
			}
		}
	}
	return &CA{Cert: cert, Key: key, Trust: trust}, nil
}

// NeedsRenewal reports whether the CA should be replaced at now.
func (ca *CA) NeedsRenewal(now time.Time) bool {
	return ca.Cert.NotAfter.Sub(now) < CARenewBefore
}

// Issue makes a leaf certificate for role, valid from now for
// LeafLifetime, with the CA's trust bundle.
func (ca *CA) Issue(role Role, now time.Time) (Bundle, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Bundle{}, fmt.Errorf("leaf key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return Bundle{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		NotBefore:    now.Add(-backdate),
		NotAfter:     now.Add(LeafLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	switch role {
	case Server:
		tmpl.Subject = pkix.Name{CommonName: mtls.RuntimedName}
		tmpl.DNSNames = []string{mtls.RuntimedName}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	case Client:
		tmpl.Subject = pkix.Name{CommonName: mtls.GatewayName}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	default:
		return Bundle{}, fmt.Errorf("unknown certificate role %d", role)
	}
	if tmpl.NotAfter.After(ca.Cert.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return Bundle{}, fmt.Errorf("leaf certificate: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return Bundle{}, err
	}
	return Bundle{CA: bytes.Clone(ca.Trust), Cert: encodeCert(der), Key: keyPEM}, nil
}

// Check reports why the leaf in b must be re-issued by ca at now, or nil
// when it is good: it parses, its key matches, it was signed by the
// current CA, it carries ca's trust bundle, it names role, and more than
// LeafRenewBefore of its life remains.
func (ca *CA) Check(b Bundle, role Role, now time.Time) error {
	certs, err := parseCerts(b.Cert)
	if err != nil {
		return fmt.Errorf("%s: %w", KeyCert, err)
	}
	key, err := parseKey(b.Key)
	if err != nil {
		return fmt.Errorf("%s: %w", KeyKey, err)
	}
	leaf := certs[0]
	if !key.PublicKey.Equal(leaf.PublicKey) {
		return errors.New("tls.key does not match tls.crt")
	}
	if err := leaf.CheckSignatureFrom(ca.Cert); err != nil {
		return fmt.Errorf("not issued by the current CA: %w", err)
	}
	if !bytes.Equal(b.CA, ca.Trust) {
		return errors.New("ca.crt is not the current trust bundle")
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	opts := x509.VerifyOptions{Roots: roots, CurrentTime: now}
	switch role {
	case Server:
		opts.DNSName = mtls.RuntimedName
		opts.KeyUsages = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	case Client:
		if leaf.Subject.CommonName != mtls.GatewayName {
			return fmt.Errorf("CN is %q, not %q", leaf.Subject.CommonName, mtls.GatewayName)
		}
		opts.KeyUsages = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	if _, err := leaf.Verify(opts); err != nil {
		return err
	}
	if left := leaf.NotAfter.Sub(now); left < LeafRenewBefore {
		return fmt.Errorf("expires in %s", left.Round(time.Second))
	}
	return nil
}

func newSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	return serial, nil
}

func encodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// parseCerts reads the PEM certificates in data; there is at least one.
func parseCerts(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		certs = append(certs, cert)
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return certs, nil
}

func parseKey(data []byte) (*ecdsa.PrivateKey, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM key")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("key is %T, not ECDSA", k)
	}
	return key, nil
}
