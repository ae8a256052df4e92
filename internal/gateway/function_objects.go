package gateway

import (
	"context"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/dispatch"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/informer"
)

// FunctionSettings is FunctionsConfig.Function from the Function
// informer, both modes': a Function exists while the informer has it and
// it is not being deleted (so that one with no replica yet, scaled to
// zero, queues its invocations instead of answering 404), with its
// spec.queue's bounds.
func FunctionSettings(fns *informer.Informer[*v1alpha1.Function]) func(dispatch.Key) (dispatch.Settings, bool) {
	return func(k dispatch.Key) (dispatch.Settings, bool) {
		fn, ok := fns.Get(k.Namespace, k.Name)
		if !ok || fn.DeletionTimestamp != nil {
			return dispatch.Settings{}, false
		}
		st := dispatch.Settings{QueueLength: int(fn.Spec.Queue.Length)}
		if w := fn.Spec.Queue.MaxWait; w != nil {
			st.QueueWait = w.Duration
		}
		return st, true
	}
}

// FunctionHandler keeps the dispatcher's settings of each Function as the
// Function informer says (register it there): a changed Function's
// settings are handed over again, and a deleted Function's waiting
// invocations are refused (404).
func (f *Functions) FunctionHandler() informer.Handler[*v1alpha1.Function] {
	resync := func(fn *v1alpha1.Function) { f.Resync(dispatch.Key{Namespace: fn.Namespace, Name: fn.Name}) }
	return informer.HandlerFuncs[*v1alpha1.Function]{
		AddFunc:    resync,
		UpdateFunc: func(_, fn *v1alpha1.Function) { resync(fn) },
		DeleteFunc: func(fn *v1alpha1.Function) {
			k := dispatch.Key{Namespace: fn.Namespace, Name: fn.Name}
			f.d.Delete(k, errdefs.Errorf(errdefs.ErrNotFound, "function %s was deleted", k))
			resync(fn) // replicas still labelled are dispatched to until they go
		},
	}
}

// FunctionFetch is FunctionsConfig.Fetch over a Function informer: a
// Function the informer has not seen yet is read from the store and
// waited for (informer.Informer.Fetch).
func FunctionFetch(fns *informer.Informer[*v1alpha1.Function]) func(context.Context, dispatch.Key) error {
	return func(ctx context.Context, k dispatch.Key) error {
		_, err := fns.Fetch(ctx, k.Namespace, k.Name)
		return err
	}
}
