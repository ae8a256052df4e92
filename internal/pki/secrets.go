package pki

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"stoke.dev/stoke/internal/logging"
)

// Secret names.
const (
	// CASecret holds the CA (tls.crt, tls.key, and ca.crt, the trust
	// bundle) in the controller's namespace; only the controller reads it.
	CASecret = "stoke-ca"
	// RuntimedSecret holds runtimed's server certificate in each Runtime
	// namespace; runtime Pods mount it in their runtimed container.
	RuntimedSecret = "stoke-runtimed-tls"
	// GatewaySecret holds the gateway's client certificate in the
	// controller's namespace.
	GatewaySecret = "stoke-gateway-tls"
)

// LabelManagedBy marks the Secrets this package writes.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "stoke"
)

// Issuer keeps the CA and the Secrets it issues. Every method is a
// create-or-get (or read-compare-update) that tolerates another controller
// doing the same at the same moment: whoever loses a create or an update
// re-reads and accepts what won, if it is good.
type Issuer struct {
	// Client writes Secrets.
	Client client.Client
	// Reader reads Secrets. Use an uncached reader (the manager's API
	// reader): a cache would watch every Secret in the cluster.
	Reader client.Reader
	// Namespace is the controller's namespace, home of CASecret and
	// GatewaySecret.
	Namespace string
	Now       func() time.Time
	Logger    *slog.Logger
}

func (i *Issuer) now() time.Time {
	if i.Now == nil {
		return time.Now()
	}
	return i.Now()
}

func (i *Issuer) log() *slog.Logger { return logging.OrDiscard(i.Logger) }

// retryable are the errors after which a re-read sees what another writer
// did: a lost create or a stale update.
func retryable(err error) bool {
	return apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err)
}

// CA returns the CA, creating it on first use and replacing it when it
// nears its end.
func (i *Issuer) CA(ctx context.Context) (*CA, error) {
	var ca *CA
	err := retry.OnError(retry.DefaultRetry, retryable, func() error {
		now := i.now()
		var s corev1.Secret
		err := i.Reader.Get(ctx, client.ObjectKey{Namespace: i.Namespace, Name: CASecret}, &s)
		switch {
		case apierrors.IsNotFound(err):
			c, b, err := NewCA(now, nil)
			if err != nil {
				return err
			}
			if err := i.Client.Create(ctx, newSecret(i.Namespace, CASecret, b)); err != nil {
				return fmt.Errorf("create secret %s/%s: %w", i.Namespace, CASecret, err)
			}
			i.log().Info("created the CA", "secret", CASecret, "namespace", i.Namespace, "not_after", c.Cert.NotAfter)
			ca = c
			return nil
		case err != nil:
			return fmt.Errorf("get secret %s/%s: %w", i.Namespace, CASecret, err)
		}
		c, err := ParseCA(bundleOf(&s), now)
		if err != nil {
			// Not ours to overwrite: whoever broke it decides.
			return fmt.Errorf("secret %s/%s: %w (delete it to make a new CA; every Secret it issued is then re-issued)", i.Namespace, CASecret, err)
		}
		if !c.NeedsRenewal(now) {
			ca = c
			return nil
		}
		c, b, err := NewCA(now, c.Cert)
		if err != nil {
			return err
		}
		setBundle(&s, b)
		if err := i.Client.Update(ctx, &s); err != nil {
			return fmt.Errorf("renew secret %s/%s: %w", i.Namespace, CASecret, err)
		}
		i.log().Info("renewed the CA", "secret", CASecret, "namespace", i.Namespace, "not_after", c.Cert.NotAfter)
		ca = c
		return nil
	})
	return ca, err
}

// EnsureLeaf makes the Secret namespace/name hold a good leaf of role from
// the current CA (see CA.Check), with owner among its owner references
// when owner is not nil. It returns when the leaf should next be looked at.
func (i *Issuer) EnsureLeaf(ctx context.Context, namespace, name string, role Role, owner *metav1.OwnerReference) (renewAt time.Time, err error) {
	ca, err := i.CA(ctx)
	if err != nil {
		return time.Time{}, err
	}
	err = retry.OnError(retry.DefaultRetry, retryable, func() error {
		now := i.now()
		var s corev1.Secret
		err := i.Reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &s)
		switch {
		case apierrors.IsNotFound(err):
			b, err := ca.Issue(role, now)
			if err != nil {
				return err
			}
			s := newSecret(namespace, name, b)
			if owner != nil {
				s.OwnerReferences = []metav1.OwnerReference{*owner}
			}
			if err := i.Client.Create(ctx, s); err != nil {
				return fmt.Errorf("create secret %s/%s: %w", namespace, name, err)
			}
			i.log().Info("issued a certificate", "secret", name, "namespace", namespace)
			renewAt = leafRenewAt(b)
			return nil
		case err != nil:
			return fmt.Errorf("get secret %s/%s: %w", namespace, name, err)
		}
		changed := false
		if why := ca.Check(bundleOf(&s), role, now); why != nil {
			b, err := ca.Issue(role, now)
			if err != nil {
				return err
			}
			i.log().Info("re-issuing a certificate", "secret", name, "namespace", namespace, "why", why.Error())
			setBundle(&s, b)
			changed = true
		}
		if owner != nil && !slices.ContainsFunc(s.OwnerReferences, func(r metav1.OwnerReference) bool { return r.UID == owner.UID }) {
			s.OwnerReferences = append(s.OwnerReferences, *owner)
			changed = true
		}
		if changed {
			if err := i.Client.Update(ctx, &s); err != nil {
				return fmt.Errorf("update secret %s/%s: %w", namespace, name, err)
			}
		}
		renewAt = leafRenewAt(bundleOf(&s))
		return nil
	})
	return renewAt, err
}

// EnsureRuntimedTLS keeps RuntimedSecret in namespace, owned (among
// others) by owner.
func (i *Issuer) EnsureRuntimedTLS(ctx context.Context, namespace string, owner *metav1.OwnerReference) (time.Time, error) {
	return i.EnsureLeaf(ctx, namespace, RuntimedSecret, Server, owner)
}

// EnsureGatewayTLS keeps GatewaySecret in the controller's namespace.
func (i *Issuer) EnsureGatewayTLS(ctx context.Context) (time.Time, error) {
	return i.EnsureLeaf(ctx, i.Namespace, GatewaySecret, Client, nil)
}

// leafRenewAt is when the leaf in b needs re-issuing; the zero time
// (look again now) when it does not parse.
func leafRenewAt(b Bundle) time.Time {
	certs, err := parseCerts(b.Cert)
	if err != nil {
		return time.Time{}
	}
	return certs[0].NotAfter.Add(-LeafRenewBefore)
}

// RenewAt is when the CA needs replacing.
func (ca *CA) RenewAt() time.Time { return ca.Cert.NotAfter.Add(-CARenewBefore) }

func newSecret(namespace, name string, b Bundle) *corev1.Secret {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace,
			Name:      name,
			Labels:    map[string]string{LabelManagedBy: ManagedBy},
		},
		Type: corev1.SecretTypeTLS,
	}
	setBundle(s, b)
	return s
}

func bundleOf(s *corev1.Secret) Bundle {
	return Bundle{CA: s.Data[KeyCA], Cert: s.Data[KeyCert], Key: s.Data[KeyKey]}
}

func setBundle(s *corev1.Secret, b Bundle) {
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	s.Data[KeyCA] = bytes.Clone(b.CA)
	s.Data[KeyCert] = bytes.Clone(b.Cert)
	s.Data[KeyKey] = bytes.Clone(b.Key)
}
