package sqlite

import (
	"crypto/rand"
	"strings"

	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"stoke.dev/stoke/internal/errdefs"
)

// validateName applies the API server's rules for a custom resource's
// identity, so that a name accepted here also works as a CRD object.
func (r *resource[T]) validateName(namespace, name string) error {
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return r.errorf(namespace, name, errdefs.ErrInvalidArgument, "metadata.namespace: %s", strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return r.errorf(namespace, name, errdefs.ErrInvalidArgument, "metadata.name: %s", strings.Join(errs, "; "))
	}
	return nil
}

// validateMeta checks the metadata a caller may write: labels (they feed
// label selectors) and finalizer names.
func (r *resource[T]) validateMeta(obj T) error {
	namespace, name := defaultNamespace(obj.GetNamespace()), obj.GetName()
	if errs := metav1validation.ValidateLabels(obj.GetLabels(), field.NewPath("metadata", "labels")); len(errs) > 0 {
		return r.errorf(namespace, name, errdefs.ErrInvalidArgument, "%s", errs.ToAggregate().Error())
	}
	for _, f := range obj.GetFinalizers() {
		if errs := validation.IsQualifiedName(f); len(errs) > 0 {
			return r.errorf(namespace, name, errdefs.ErrInvalidArgument, "metadata.finalizers %q: %s", f, strings.Join(errs, "; "))
		}
	}
	return nil
}

// suffixAlphabet is the API server's generateName alphabet: no vowels (no
// words) and no look-alike characters.
const suffixAlphabet = "bcdfghjklmnpqrstvwxz2456789"

// randomSuffix is what generateName appends: five characters, as the API
// server does.
func randomSuffix() string {
	var b [5]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	for i := range b {
		b[i] = suffixAlphabet[int(b[i])%len(suffixAlphabet)]
	}
	return string(b[:])
}
