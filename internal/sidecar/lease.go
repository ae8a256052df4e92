package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// Lease timing (KUBE.md): a Pod whose Lease was not renewed within its
// duration is fenced by the controller's reaper.
const (
	DefaultLeaseDuration = 10 * time.Second
	DefaultRenewInterval = 2 * time.Second
	// renewTimeout bounds one renewal's API calls.
	renewTimeout = 2 * time.Second
	// retryFirst is the first wait after a failed renewal, doubled up to
	// the renew interval.
	retryFirst = 100 * time.Millisecond
)

// leaseRenewer keeps the Pod's Lease: named after the Pod, held by the Pod
// UID, owned by the Pod (so it goes with it). Renewals are the Pod's
// heartbeat; they are never writes to Runs.
type leaseRenewer struct {
	leases   coordclient.LeaseInterface
	name     string
	holder   string
	owner    metav1.OwnerReference
	duration time.Duration
	interval time.Duration
	clock    clock.WithTicker
	log      *slog.Logger

	mu sync.Mutex
	// last is the Lease as last written; an update starts from it, so a
	// renewal is one write, and a conflict makes it read again.
	last    *coordinationv1.Lease
	renewed time.Time // when the last renewal succeeded (by clock)
}

// Run renews the Lease every interval until ctx ends. A failed renewal is
// retried with a short backoff; it never ends the loop.
func (l *leaseRenewer) Run(ctx context.Context) error {
	wait := time.Duration(0)
	backoff := retryFirst
	for {
		t := l.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
		rctx, cancel := context.WithTimeout(ctx, renewTimeout)
		err := l.renew(rctx)
		cancel()
		if err == nil {
			wait, backoff = l.interval, retryFirst
			continue
		}
		if ctx.Err() != nil {
			return nil
		}
		l.log.Warn("renewing the pod's lease", "lease", l.name, "error", err, "retry_in", backoff)
		wait, backoff = backoff, min(2*backoff, l.interval)
	}
}

// Renewed returns when the Lease was last renewed, zero before the first.
func (l *leaseRenewer) Renewed() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.renewed
}

// Fresh reports whether the Lease was renewed within its duration, as the
// controller judges it.
func (l *leaseRenewer) Fresh() error {
	last := l.Renewed()
	if last.IsZero() {
		return errors.New("the pod's lease has not been renewed yet")
	}
	if age := l.clock.Since(last); age >= l.duration {
		return fmt.Errorf("the pod's lease was last renewed %s ago, past its duration of %s", age.Round(time.Millisecond), l.duration)
	}
	return nil
}

func (l *leaseRenewer) renew(ctx context.Context) error {
	l.mu.Lock()
	cur := l.last
	l.mu.Unlock()
	now := metav1.NewMicroTime(l.clock.Now())
	if cur == nil {
		got, err := l.leases.Get(ctx, l.name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			created, err := l.leases.Create(ctx, l.desired(nil, now), metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("create lease %s: %w", l.name, err)
			}
			l.stored(created, now)
			return nil
		case err != nil:
			return fmt.Errorf("get lease %s: %w", l.name, err)
		}
		cur = got
	}
	updated, err := l.leases.Update(ctx, l.desired(cur, now), metav1.UpdateOptions{})
	if err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			// Changed or deleted by someone else: read it again next time.
			l.mu.Lock()
			l.last = nil
			l.mu.Unlock()
		}
		return fmt.Errorf("update lease %s: %w", l.name, err)
	}
	l.stored(updated, now)
	return nil
}

// desired is the Lease renewed at now, from cur (nil: a new one).
func (l *leaseRenewer) desired(cur *coordinationv1.Lease, now metav1.MicroTime) *coordinationv1.Lease {
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: l.name}}
	if cur != nil {
		lease = cur.DeepCopy()
	}
	lease.OwnerReferences = []metav1.OwnerReference{l.owner}
	spec := &lease.Spec
	if spec.HolderIdentity == nil || *spec.HolderIdentity != l.holder {
		// A Lease of another holder (a Pod of the same name before this
		// one) is taken over.
		if spec.HolderIdentity != nil {
			spec.LeaseTransitions = ptr.To(ptr.Deref(spec.LeaseTransitions, 0) + 1)
		}
		spec.HolderIdentity = ptr.To(l.holder)
		spec.AcquireTime = &now
	}
	spec.LeaseDurationSeconds = ptr.To(int32(l.duration / time.Second))
	spec.RenewTime = &now
	return lease
}

func (l *leaseRenewer) stored(lease *coordinationv1.Lease, at metav1.MicroTime) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.last = lease
	l.renewed = at.Time
}
