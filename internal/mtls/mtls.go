// Package mtls is the mutual TLS of runtimed's hop in Kubernetes mode: the
// gateway is the only caller a runtime Pod's port accepts. Both ends load
// their credentials from a directory laid out as a Kubernetes TLS Secret
// mounted as a volume (ca.crt, tls.crt, tls.key). runtimed serves with a
// certificate for the DNS name RuntimedName and requires a client
// certificate that chains to ca.crt and names GatewayName as its common
// name; the gateway presents that certificate and verifies the server name
// RuntimedName. TLS 1.3 only.
//
// The files are read again when they change (a rotated Secret): each new
// connection checks them and uses the newest pair that loads, so that a
// half-updated volume keeps the last good credentials.
package mtls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// The files of a kubernetes.io/tls Secret with its CA.
const (
	CAFile   = "ca.crt"
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
)

// The two names the hop's certificates carry.
const (
	// GatewayName is the common name of the one client certificate
	// runtimed accepts.
	GatewayName = "stoke-gateway"
	// RuntimedName is the DNS name of runtimed's server certificate,
	// which the gateway verifies whatever Pod IP it dials.
	RuntimedName = "stoke-runtimed"
)

// ServerConfig is runtimed's side: its certificate from dir, and a client
// certificate required that chains to dir's ca.crt with common name
// GatewayName. It fails when the files do not load.
func ServerConfig(dir string) (*tls.Config, error) {
	c, err := newCreds(dir)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cur := c.current()
			return &tls.Config{
				MinVersion:       tls.VersionTLS13,
				Certificates:     []tls.Certificate{cur.cert},
				ClientAuth:       tls.RequireAndVerifyClientCert,
				ClientCAs:        cur.roots,
				NextProtos:       []string{"h2"}, // gRPC's ALPN; this config replaces the one credentials.NewTLS set it on
				VerifyConnection: requireCommonName(GatewayName),
			}, nil
		},
	}, nil
}

// ClientConfig is the gateway's side: its client certificate from dir,
// and a server certificate required that chains to dir's ca.crt and is
// valid for RuntimedName.
func ClientConfig(dir string) (*tls.Config, error) {
	c, err := newCreds(dir)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ServerName: RuntimedName,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert := c.current().cert
			return &cert, nil
		},
		// The chain is verified below, against the CA as it is now: the
		// standard verification would pin the roots loaded at start.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("mtls: the server sent no certificate")
			}
			opts := x509.VerifyOptions{
				DNSName:       RuntimedName,
				Roots:         c.current().roots,
				Intermediates: x509.NewCertPool(),
				KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			}
			for _, ic := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(ic)
			}
			if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
				return fmt.Errorf("mtls: server certificate: %w", err)
			}
			return nil
		},
	}, nil
}

// requireCommonName refuses a verified client whose leaf certificate does
// not name cn.
func requireCommonName(cn string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.VerifiedChains) == 0 || len(cs.PeerCertificates) == 0 {
			return errors.New("mtls: no verified client certificate")
		}
		if got := cs.PeerCertificates[0].Subject.CommonName; got != cn {
			return fmt.Errorf("mtls: client certificate names %q, not %q", got, cn)
		}
		return nil
	}
}

// loaded is one consistent set of credentials.
type loaded struct {
	cert  tls.Certificate
	roots *x509.CertPool
	stamp [3]fileStamp
}

type fileStamp struct {
	size  int64
	mtime time.Time
	ino   uint64
}

// creds holds the newest credentials that loaded from a directory.
type creds struct {
	dir string

	mu   sync.Mutex
	last *loaded
}

func newCreds(dir string) (*creds, error) {
	c := &creds{dir: dir}
	l, err := c.load()
	if err != nil {
		return nil, err
	}
	c.last = l
	return c, nil
}

func (c *creds) paths() [3]string {
	return [3]string{filepath.Join(c.dir, CAFile), filepath.Join(c.dir, CertFile), filepath.Join(c.dir, KeyFile)}
}

// stamps identifies the files' current contents without reading them.
// Stat follows the symlinks a Secret volume swaps on an update.
func (c *creds) stamps() ([3]fileStamp, error) {
	var out [3]fileStamp
	for n, p := range c.paths() {
		fi, err := os.Stat(p)
		if err != nil {
			return out, fmt.Errorf("mtls: %w", err)
		}
		out[n] = fileStamp{size: fi.Size(), mtime: fi.ModTime(), ino: inode(fi)}
	}
	return out, nil
}

func (c *creds) load() (*loaded, error) {
	stamp, err := c.stamps()
	if err != nil {
		return nil, err
	}
	p := c.paths()
	caPEM, err := os.ReadFile(p[0])
	if err != nil {
		return nil, fmt.Errorf("mtls: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("mtls: %s holds no PEM certificate", p[0])
	}
	cert, err := tls.LoadX509KeyPair(p[1], p[2])
	if err != nil {
		return nil, fmt.Errorf("mtls: %s and %s: %w", p[1], p[2], err)
	}
	return &loaded{cert: cert, roots: roots, stamp: stamp}, nil
}

// current returns the credentials as the files are now, or the last ones
// that loaded when the files are missing or do not load (yet).
func (c *creds) current() *loaded {
	c.mu.Lock()
	defer c.mu.Unlock()
	if stamp, err := c.stamps(); err != nil || stamp == c.last.stamp {
		return c.last
	}
	if l, err := c.load(); err == nil {
		c.last = l
	}
	return c.last
}
