// Package v1alpha1 holds Stoke's public API types, Run and Runtime
// (apiVersion stoke.dev/v1alpha1), shaped as Kubernetes objects so that the
// same YAML works with `stoke apply -f` in standalone mode and with
// `kubectl apply -f` against the CRDs generated from these types.
//
// +kubebuilder:object:generate=true
// +groupName=stoke.dev
package v1alpha1
