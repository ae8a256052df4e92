package pki_test

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"stoke.dev/stoke/internal/kubetest"
	"stoke.dev/stoke/internal/pki"
)

func TestMain(m *testing.M) { kubetest.Main(m, kubetest.Options{}) }

// TestIssuersRaceToOneCA runs several issuers at once against a real API
// server, as two controllers might during a leader change: they all end
// with the same CA, and the Secrets they leave verify against it. A later
// call with a clock past the renewal point re-issues the leaf, and one past
// the CA's renewal point replaces the CA and re-issues again.
func TestIssuersRaceToOneCA(t *testing.T) {
	c := kubetest.Shared(t)
	cl, err := client.New(c.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	ctrlNS, ns := c.Namespace(t), c.Namespace(t)
	now := time.Now()
	issuer := func(at time.Time) *pki.Issuer {
		return &pki.Issuer{Client: cl, Reader: cl, Namespace: ctrlNS, Now: func() time.Time { return at }}
	}

	const n = 4
	cas := make([]*pki.CA, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			iss := issuer(now)
			if _, errs[i] = iss.EnsureRuntimedTLS(ctx, ns, nil); errs[i] != nil {
				return
			}
			if _, errs[i] = iss.EnsureGatewayTLS(ctx); errs[i] != nil {
				return
			}
			cas[i], errs[i] = iss.CA(ctx)
		})
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("issuer %d: %v", i, errs[i])
		}
		if !cas[i].Cert.Equal(cas[0].Cert) {
			t.Fatalf("issuers %d and 0 ended with different CAs", i)
		}
	}
	ca := cas[0]
	secret := func(ns, name string) (*corev1.Secret, pki.Bundle) {
		var s corev1.Secret
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
			t.Fatal(err)
		}
		return &s, pki.Bundle{CA: s.Data[pki.KeyCA], Cert: s.Data[pki.KeyCert], Key: s.Data[pki.KeyKey]}
	}
	srv, srvB := secret(ns, pki.RuntimedSecret)
	if err := ca.Check(srvB, pki.Server, now); err != nil {
		t.Fatalf("runtimed's Secret: %v", err)
	}
	if _, cliB := secret(ctrlNS, pki.GatewaySecret); ca.Check(cliB, pki.Client, now) != nil {
		t.Fatalf("the gateway's Secret: %v", ca.Check(cliB, pki.Client, now))
	}

	// Nothing to do: nothing is written.
	if _, err := issuer(now).EnsureRuntimedTLS(ctx, ns, nil); err != nil {
		t.Fatal(err)
	}
	if again, _ := secret(ns, pki.RuntimedSecret); again.ResourceVersion != srv.ResourceVersion {
		t.Fatal("an ensure with nothing to renew wrote the Secret")
	}

	// Near the leaf's end: a new leaf from the same CA, and an owner added.
	later := now.Add(pki.LeafLifetime - pki.LeafRenewBefore + time.Hour)
	owner := &metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "owner", UID: "3a5c1d7e-0000-4000-8000-000000000001"}
	renewAt, err := issuer(later).EnsureRuntimedTLS(ctx, ns, owner)
	if err != nil {
		t.Fatal(err)
	}
	renewed, renewedB := secret(ns, pki.RuntimedSecret)
	if string(renewedB.Cert) == string(srvB.Cert) || ca.Check(renewedB, pki.Server, later) != nil || len(renewed.OwnerReferences) != 1 {
		t.Fatalf("after renewal: same cert %v, check %v, owners %v", string(renewedB.Cert) == string(srvB.Cert), ca.Check(renewedB, pki.Server, later), renewed.OwnerReferences)
	}
	if !renewAt.After(later) {
		t.Fatalf("renew at %v, not after %v", renewAt, later)
	}

	// Near the CA's end: a new CA that still trusts the old one, and the
	// leaf re-issued from it.
	caLater := now.Add(pki.CALifetime - pki.CARenewBefore + time.Hour)
	if _, err := issuer(caLater).EnsureRuntimedTLS(ctx, ns, nil); err != nil {
		t.Fatal(err)
	}
	newCA, err := issuer(caLater).CA(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if newCA.Cert.Equal(ca.Cert) {
		t.Fatal("the CA was not replaced near its end")
	}
	if _, b := secret(ns, pki.RuntimedSecret); newCA.Check(b, pki.Server, caLater) != nil {
		t.Fatalf("runtimed's Secret after the CA's renewal: %v", newCA.Check(b, pki.Server, caLater))
	}
}

// A CA Secret someone broke is reported, not overwritten.
func TestBrokenCAIsNotOverwritten(t *testing.T) {
	c := kubetest.Shared(t)
	cl, err := client.New(c.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := c.Namespace(t)
	bad := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pki.CASecret}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{pki.KeyCert: []byte("x"), pki.KeyKey: []byte("y")}}
	if err := cl.Create(ctx, bad); err != nil {
		t.Fatal(err)
	}
	if _, err := (&pki.Issuer{Client: cl, Reader: cl, Namespace: ns}).CA(ctx); err == nil {
		t.Fatal("a broken CA Secret was accepted")
	}
	var s corev1.Secret
	if err := cl.Get(ctx, client.ObjectKeyFromObject(bad), &s); err != nil || string(s.Data[pki.KeyCert]) != "x" {
		t.Fatalf("the broken CA Secret was changed: %v", err)
	}
}
