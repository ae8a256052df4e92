package validation

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// DefaultNamespace is the namespace of an object that names none.
const DefaultNamespace = "default"

// SetRunDefaults fills in what a new Run may leave out: apiVersion and kind,
// metadata.namespace ("default") and spec.retryPolicy with maxAttempts 1.
// It leaves spec.retryPolicy.backoff unset when it is unset: the retry
// engine (internal/retry) owns the default backoff. It never overwrites a
// value that is set, and it is idempotent.
func SetRunDefaults(run *v1alpha1.Run) {
	if run == nil {
		return
	}
	setTypeMeta(&run.TypeMeta, v1alpha1.KindRun)
	if run.Namespace == "" {
		run.Namespace = DefaultNamespace
	}
	if run.Spec.RetryPolicy == nil {
		run.Spec.RetryPolicy = &v1alpha1.RetryPolicy{}
	}
	if run.Spec.RetryPolicy.MaxAttempts == 0 {
		run.Spec.RetryPolicy.MaxAttempts = 1
	}
}

// SetRuntimeDefaults fills in what a new Runtime may leave out: apiVersion
// and kind, metadata.namespace ("default") and spec.runs (1, since 0 slots
// is never meaningful). spec.replicas is not defaulted: 0 is a valid,
// scaled-to-zero pool and cannot be told apart from "unset".
func SetRuntimeDefaults(rt *v1alpha1.Runtime) {
	if rt == nil {
		return
	}
	setTypeMeta(&rt.TypeMeta, v1alpha1.KindRuntime)
	if rt.Namespace == "" {
		rt.Namespace = DefaultNamespace
	}
	if rt.Spec.Runs == 0 {
		rt.Spec.Runs = 1
	}
}

func setTypeMeta(tm *metav1.TypeMeta, kind string) {
	if tm.APIVersion == "" {
		tm.APIVersion = v1alpha1.GroupVersion.String()
	}
	if tm.Kind == "" {
		tm.Kind = kind
	}
}
