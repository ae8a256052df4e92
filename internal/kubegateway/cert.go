package kubegateway

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"sync/atomic"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
)

// servingCert is the gateway's serving certificate from files, reloaded
// when they change: the kubelet updates a mounted Secret in place (it
// swaps the directory the files link to), and a renewed certificate must
// reach new connections without a restart. The watching is k8s.io/apiserver's
// (fsnotify on both files, re-armed after a rename or removal, and a
// check every minute besides); a pair that does not load (a key that does
// not match its certificate, half-written files) is not taken, and the
// previous one serves on.
type servingCert struct {
	content *dynamiccertificates.DynamicCertKeyPairContent
	log     *slog.Logger
	cur     atomic.Pointer[tls.Certificate]
	// loaded is signalled after each pair taken (tests await it).
	loaded chan struct{}
}

// newServingCert loads the pair once; Run watches it.
func newServingCert(certFile, keyFile string, log *slog.Logger) (*servingCert, error) {
	content, err := dynamiccertificates.NewDynamicServingContentFromFiles("stoke-gateway serving certificate", certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("gateway: serving certificate: %w", err)
	}
	s := &servingCert{content: content, log: log, loaded: make(chan struct{}, 1)}
	if err := s.take(); err != nil {
		return nil, err
	}
	content.AddListener(s)
	return s, nil
}

// Enqueue implements dynamiccertificates.Listener: the files changed.
func (s *servingCert) Enqueue() {
	if err := s.take(); err != nil {
		s.log.Warn("gateway: the changed serving certificate does not load; the previous one serves on", "error", err)
		return
	}
	s.log.Info("gateway: serving certificate reloaded")
}

func (s *servingCert) take() error {
	certPEM, keyPEM := s.content.CurrentCertKeyContent()
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("gateway: serving certificate: %w", err)
	}
	s.cur.Store(&cert)
	select {
	case s.loaded <- struct{}{}:
	default:
	}
	return nil
}

// GetCertificate is tls.Config.GetCertificate: the current pair.
func (s *servingCert) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return s.cur.Load(), nil
}

// Run watches the files until ctx ends.
func (s *servingCert) Run(ctx context.Context) {
	s.content.Run(ctx, 1)
}
