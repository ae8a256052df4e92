package runtimeset

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/pki"
)

// The runtime-server container's ServiceAccount token (a template's
// serviceAccountName). A Pod has one ServiceAccount, and the runtime
// Pods' is stoke-runtimed, on which the admission policies key: users'
// code must never have it. So the controller mints the template's
// ServiceAccount's token itself, with a TokenRequest bound to the one
// Secret of the namespace that holds these tokens, and each runtime Pod
// mounts that Secret in its runtime-server container alone, selecting
// its Runtime's key as the token (a Deployment's Pods share one template,
// so a per-Pod Secret could not be named in it). Bound to the Secret, a
// token dies with it: when a Runtime stops asking for a token or names
// another ServiceAccount, the Secret is made anew and every token in it
// minted again, so no token outlives what asked for it. One fixed name
// keeps the controller's Secret rights to that name (RBAC resourceNames).
const (
	// TokenSecret is the namespace's Secret of runtime-server tokens.
	TokenSecret = "stoke-runtime-server-tokens"
	// serverTokenExpiry is what each TokenRequest asks for; the API
	// server may give another lifetime, and the token is minted again at
	// serverTokenRefresh of what it gave.
	serverTokenExpiry  = 3600
	serverTokenRefresh = 0.8
	// volumeServerToken is the runtime-server container's token volume.
	volumeServerToken = "runtime-server-token"
	// tokenCAKey and tokenNamespaceKey are the Secret's shared keys.
	tokenCAKey        = "ca.crt"
	tokenNamespaceKey = "namespace"
)

// tokenKey is rt's token in the Secret; metaKey what it was minted for.
func tokenKey(runtime string) string { return runtime + ".token" }
func metaKey(runtime string) string  { return runtime + ".meta" }

// tokenMeta is what a Runtime's token was minted for, and when to mint
// it again.
type tokenMeta struct {
	ServiceAccount string    `json:"serviceAccount"`
	RefreshAt      time.Time `json:"refreshAt"`
}

// serverTokenVolume is the runtime-server container's token volume: the
// Secret's keys for rt, in the files a ServiceAccount token mount has.
func serverTokenVolume(rt *v1alpha1.Runtime) corev1.Volume {
	return corev1.Volume{Name: volumeServerToken, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName:  TokenSecret,
		DefaultMode: ptr.To(int32(0o444)),
		Items: []corev1.KeyToPath{
			{Key: tokenKey(rt.Name), Path: "token"},
			{Key: tokenCAKey, Path: "ca.crt"},
			{Key: tokenNamespaceKey, Path: "namespace"},
		},
	}}}
}

// tokens keeps one namespace's TokenSecret.
type tokens struct {
	client client.Client // the manager's: Runtimes from its cache, TokenRequests
	reader client.Reader // uncached: the Secret (the controller watches no Secrets)
	caData func() ([]byte, error)
	now    func() time.Time
}

// caFrom is the API server's CA as the controller reaches it: the bytes
// of its REST config, or its file read at each use (an in-cluster file
// may be rotated).
func caFrom(cfg *rest.Config) func() ([]byte, error) {
	return func() ([]byte, error) {
		if len(cfg.CAData) > 0 {
			return cfg.CAData, nil
		}
		if cfg.CAFile != "" {
			return os.ReadFile(cfg.CAFile)
		}
		return nil, nil
	}
}

// sync brings namespace ns's TokenSecret to its Runtimes' templates and
// returns when it next needs minting (zero: never).
func (t *tokens) sync(ctx context.Context, ns string) (time.Time, error) {
	var list v1alpha1.RuntimeList
	if err := t.client.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return time.Time{}, fmt.Errorf("list runtimes: %w", err)
	}
	want := map[string]*v1alpha1.Runtime{}
	for i := range list.Items {
		rt := &list.Items[i]
		if rt.DeletionTimestamp == nil && rt.Spec.Template.MountsServiceAccountToken() {
			want[rt.Name] = rt
		}
	}
	var sec corev1.Secret
	err := t.reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: TokenSecret}, &sec)
	switch {
	case apierrors.IsNotFound(err):
		if len(want) == 0 {
			return time.Time{}, nil
		}
		return t.create(ctx, ns, want)
	case err != nil:
		return time.Time{}, fmt.Errorf("get secret %s/%s: %w", ns, TokenSecret, err)
	}
	// A token minted for what no Runtime asks for any more must die:
	// only a new Secret (a new UID) kills the tokens bound to the old.
	stale := len(want) == 0
	for k := range sec.Data {
		rt, ok := strings.CutSuffix(k, ".meta")
		if !ok {
			continue
		}
		var m tokenMeta
		if w := want[rt]; w == nil || json.Unmarshal(sec.Data[k], &m) != nil || m.ServiceAccount != w.Spec.Template.ServiceAccountName {
			stale = true
		}
	}
	if stale {
		if err := t.client.Delete(ctx, &sec, client.Preconditions{UID: &sec.UID}); err != nil && !apierrors.IsNotFound(err) {
			return time.Time{}, fmt.Errorf("delete secret %s/%s: %w", ns, TokenSecret, err)
		}
		if len(want) == 0 {
			return time.Time{}, nil
		}
		return t.create(ctx, ns, want)
	}
	next, changed, err := t.mint(ctx, &sec, want)
	if err != nil || !changed {
		return next, err
	}
	if err := t.client.Update(ctx, &sec); err != nil {
		return time.Time{}, fmt.Errorf("update secret %s/%s: %w", ns, TokenSecret, err)
	}
	return next, nil
}

// create makes the Secret anew and mints every wanted token into it.
func (t *tokens) create(ctx context.Context, ns string, want map[string]*v1alpha1.Runtime) (time.Time, error) {
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: TokenSecret,
		Labels: map[string]string{pki.LabelManagedBy: pki.ManagedBy, LabelName: NameRuntimePod}}}
	if err := t.client.Create(ctx, sec); err != nil {
		return time.Time{}, fmt.Errorf("create secret %s/%s: %w", ns, TokenSecret, err)
	}
	next, _, err := t.mint(ctx, sec, want)
	if err != nil {
		return time.Time{}, err
	}
	if err := t.client.Update(ctx, sec); err != nil {
		return time.Time{}, fmt.Errorf("update secret %s/%s: %w", ns, TokenSecret, err)
	}
	return next, nil
}

// mint puts into sec a token for each wanted Runtime that has none or
// whose token is due, bound to sec, with the shared keys and the wanted
// Runtimes as owners (the Secret goes with the last of them); it reports
// the earliest refresh and whether sec changed.
func (t *tokens) mint(ctx context.Context, sec *corev1.Secret, want map[string]*v1alpha1.Runtime) (time.Time, bool, error) {
	now := t.now()
	if sec.Data == nil {
		sec.Data = map[string][]byte{}
	}
	changed := false
	var next time.Time
	for _, name := range slices.Sorted(maps.Keys(want)) {
		rt := want[name]
		var m tokenMeta
		if err := json.Unmarshal(sec.Data[metaKey(name)], &m); err != nil || now.After(m.RefreshAt) || len(sec.Data[tokenKey(name)]) == 0 {
			sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: sec.Namespace, Name: rt.Spec.Template.ServiceAccountName}}
			tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
				ExpirationSeconds: ptr.To(int64(serverTokenExpiry)),
				BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Secret", APIVersion: "v1", Name: sec.Name, UID: sec.UID},
			}}
			if err := t.client.SubResource("token").Create(ctx, sa, tr); err != nil {
				return time.Time{}, false, fmt.Errorf("runtime %s/%s: a token for ServiceAccount %s: %w", sec.Namespace, name, sa.Name, err)
			}
			life := tr.Status.ExpirationTimestamp.Sub(now)
			m = tokenMeta{ServiceAccount: sa.Name, RefreshAt: now.Add(time.Duration(float64(life) * serverTokenRefresh))}
			b, err := json.Marshal(m)
			if err != nil {
				return time.Time{}, false, err
			}
			sec.Data[tokenKey(name)] = []byte(tr.Status.Token)
			sec.Data[metaKey(name)] = b
			changed = true
		}
		if next.IsZero() || m.RefreshAt.Before(next) {
			next = m.RefreshAt
		}
	}
	ca, err := t.caData()
	if err != nil {
		return time.Time{}, false, fmt.Errorf("the API server's CA: %w", err)
	}
	for k, v := range map[string][]byte{tokenCAKey: ca, tokenNamespaceKey: []byte(sec.Namespace)} {
		if string(sec.Data[k]) != string(v) {
			sec.Data[k] = v
			changed = true
		}
	}
	var owners []metav1.OwnerReference
	for _, name := range slices.Sorted(maps.Keys(want)) {
		owners = append(owners, ownerRef(want[name]))
	}
	if !slices.Equal(owners, sec.OwnerReferences) {
		sec.OwnerReferences = owners
		changed = true
	}
	return next, changed, nil
}
