package validation

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8svalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
)

// SetFunctionDefaults fills in what a new or updated Function may leave
// out, as the CRD's default markers do: apiVersion and kind,
// metadata.namespace ("default"), and each of scale.max,
// scale.targetInFlight, scale.idleSeconds, queue.length, queue.maxWait and
// drainSeconds that is unset or 0 (Go's zero value cannot say which; none
// of them is meaningful at 0). scale.min's default is 0 and spec.replicas
// stays unset (it then means scale.min). It is idempotent.
func SetFunctionDefaults(fn *v1alpha1.Function) {
	if fn == nil {
		return
	}
	setTypeMeta(&fn.TypeMeta, v1alpha1.KindFunction)
	if fn.Namespace == "" {
		fn.Namespace = DefaultNamespace
	}
	s := &fn.Spec
	setZero(&s.Scale.Max, bounds.DefaultFunctionMax)
	setZero(&s.Scale.TargetInFlight, bounds.DefaultFunctionTargetInFlight)
	setZero(&s.Scale.IdleSeconds, bounds.DefaultFunctionIdleSeconds)
	setZero(&s.Queue.Length, bounds.FunctionQueue)
	setZero(&s.DrainSeconds, bounds.DefaultFunctionDrainSeconds)
	if s.Queue.MaxWait == nil {
		s.Queue.MaxWait = &metav1.Duration{Duration: bounds.FunctionQueueWait}
	}
}

func setZero(v *int32, def int32) {
	if *v == 0 {
		*v = def
	}
}

// ValidateFunction checks a Function on creation or, through
// ValidateFunctionUpdate, on update. Call SetFunctionDefaults first. The
// template fields follow a function Run's rules (a replica is one); the
// name is a DNS-1123 label, since it is the value of every replica's
// stoke.dev/function label.
func ValidateFunction(fn *v1alpha1.Function) error {
	var e errorList
	if fn == nil {
		e.add(field.NewPath("function"), "must not be nil")
		return e.err()
	}
	validateFunction(&e, fn)
	if err := e.err(); err != nil {
		return err
	}
	return objectSize(fn, v1alpha1.Function{TypeMeta: fn.TypeMeta, ObjectMeta: fn.ObjectMeta, Spec: fn.Spec})
}

// ValidateFunctionUpdate checks an update of old to new: new must be valid,
// and metadata name, namespace and uid are immutable. Every spec field may
// change: a template change rolls the replicas.
func ValidateFunctionUpdate(old, new *v1alpha1.Function) error {
	var e errorList
	if old == nil || new == nil {
		e.add(field.NewPath("function"), "must not be nil")
		return e.err()
	}
	validateFunction(&e, new)
	validateObjectMetaUpdate(&e, &old.ObjectMeta, &new.ObjectMeta)
	if err := e.err(); err != nil {
		return err
	}
	return objectSize(new, v1alpha1.Function{TypeMeta: new.TypeMeta, ObjectMeta: new.ObjectMeta, Spec: new.Spec})
}

func validateFunction(e *errorList, fn *v1alpha1.Function) {
	validateTypeMeta(e, fn.TypeMeta, v1alpha1.KindFunction)
	validateObjectMeta(e, &fn.ObjectMeta, k8svalidation.IsDNS1123Label)
	validateNoStokeFinalizers(e, fn.Finalizers)

	s, spec := &fn.Spec, field.NewPath("spec")
	if s.Runtime == "" {
		e.add(spec.Child("runtime"), "must not be empty")
	} else {
		for _, msg := range k8svalidation.IsDNS1123Label(s.Runtime) {
			e.add(spec.Child("runtime"), "%s: %s", quote(s.Runtime), msg)
		}
	}
	validateHandler(e, s.Handler, spec.Child("handler"))
	validateSource(e, s.Source, spec.Child("source"))
	validateEnv(e, s.Env, spec.Child("env"))
	validateDuration(e, s.Timeout, spec.Child("timeout"))
	if r := s.Replicas; r != nil {
		inRange(e, spec.Child("replicas"), *r, 0, bounds.FunctionReplicas)
	}
	scale := spec.Child("scale")
	minOK := inRange(e, scale.Child("min"), s.Scale.Min, 0, bounds.FunctionReplicas)
	maxOK := inRange(e, scale.Child("max"), s.Scale.Max, 1, bounds.FunctionReplicas)
	if minOK && maxOK && s.Scale.Min > s.Scale.Max {
		e.add(scale, "scale.min must not exceed scale.max (min %d, max %d)", s.Scale.Min, s.Scale.Max)
	}
	inRange(e, scale.Child("targetInFlight"), s.Scale.TargetInFlight, 1, bounds.FunctionTargetInFlight)
	inRange(e, scale.Child("idleSeconds"), s.Scale.IdleSeconds, 1, bounds.FunctionIdleSeconds)
	queue := spec.Child("queue")
	inRange(e, queue.Child("length"), s.Queue.Length, 1, bounds.MaxFunctionQueue)
	if w := s.Queue.MaxWait; w != nil && (w.Duration <= 0 || w.Duration > bounds.MaxFunctionQueueWait) {
		e.add(queue.Child("maxWait"), "is %s, must be more than 0s and at most %s", w.Duration, shortDuration(bounds.MaxFunctionQueueWait))
	}
	inRange(e, spec.Child("drainSeconds"), s.DrainSeconds, 1, bounds.FunctionDrainSeconds)
}

// inRange reports whether lo ≤ v ≤ hi, adding the problem when not.
func inRange(e *errorList, p *field.Path, v, lo, hi int32) bool {
	if v < lo || v > hi {
		e.add(p, "is %d, must be %d–%d", v, lo, hi)
		return false
	}
	return true
}

// shortDuration prints 15m rather than time's 15m0s, as the CRD's message
// does.
func shortDuration(d time.Duration) string {
	if d%time.Minute == 0 {
		return (d / time.Minute).String() + "m"
	}
	return d.String()
}
