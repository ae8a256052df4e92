package runtimeset

import (
	"context"
	"log/slog"
	"time"

	"k8s.io/utils/clock"

	"stoke.dev/stoke/internal/pki"
)

// caRetry is how soon the CA keeper tries again after a failure.
const caRetry = 10 * time.Second

// caKeeper keeps the CA and the gateway's client certificate: at start and
// again before either needs renewing. The runtime namespaces' certificates
// are the "runtime" controller's.
type caKeeper struct {
	issuer *pki.Issuer
	clock  clock.Clock
	log    *slog.Logger
}

// Start blocks until ctx ends (a manager Runnable; it needs leader
// election, so only the leader writes).
func (k *caKeeper) Start(ctx context.Context) error {
	for {
		next, err := k.ensure(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			k.log.Error("cannot keep the CA and the gateway's certificate", "err", err)
			next = caRetry
		}
		t := k.clock.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
	}
}

// ensure keeps both and returns how long until one needs looking at.
func (k *caKeeper) ensure(ctx context.Context) (time.Duration, error) {
	ca, err := k.issuer.CA(ctx)
	if err != nil {
		return 0, err
	}
	renewAt, err := k.issuer.EnsureGatewayTLS(ctx)
	if err != nil {
		return 0, err
	}
	if ca.RenewAt().Before(renewAt) {
		renewAt = ca.RenewAt()
	}
	// A day at most: a timer of months outlives a suspended clock badly.
	return min(max(renewAt.Sub(k.clock.Now()), caRetry), 24*time.Hour), nil
}
