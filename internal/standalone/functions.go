package standalone

import (
	"context"
	"errors"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/store"
	"stoke.dev/stoke/internal/validation"
)

// CreateFunction defaults and validates a Function and stores it; the
// Function controller then makes its replicas. A Function naming a Runtime
// that does not exist is refused, as a Run is: nothing is stored.
func (s *Standalone) CreateFunction(ctx context.Context, fn *v1alpha1.Function) (*v1alpha1.Function, error) {
	if err := s.checkFunction(ctx, fn); err != nil {
		return nil, err
	}
	return s.store.Functions().Create(ctx, fn)
}

// ApplyFunction creates a Function or replaces the spec and labels of the
// one of its name; a template change rolls its replicas. An apply that
// leaves spec.replicas unset keeps the stored desired count (the
// autoscaler's or `stoke scale`'s), as kubectl apply keeps a field it does
// not set.
func (s *Standalone) ApplyFunction(ctx context.Context, fn *v1alpha1.Function) (*v1alpha1.Function, error) {
	if err := s.checkFunction(ctx, fn); err != nil {
		return nil, err
	}
	return store.CreateOrUpdate(ctx, s.store.Functions(), fn, func(cur *v1alpha1.Function) (*v1alpha1.Function, error) {
		next := cur.DeepCopy()
		next.Spec = fn.Spec
		if next.Spec.Replicas == nil {
			next.Spec.Replicas = cur.Spec.Replicas
		}
		next.Labels = fn.Labels
		return next, validation.ValidateFunctionUpdate(cur, next)
	})
}

func (s *Standalone) checkFunction(ctx context.Context, fn *v1alpha1.Function) error {
	validation.SetFunctionDefaults(fn)
	if err := validation.ValidateFunction(fn); err != nil {
		return err
	}
	if _, ok := s.rtInf.Get(fn.Namespace, fn.Spec.Runtime); ok {
		return nil
	}
	if _, err := s.store.Runtimes().Get(ctx, fn.Namespace, fn.Spec.Runtime); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return errdefs.InvalidArgument("spec.runtime", "no Runtime %q in namespace %q", fn.Spec.Runtime, fn.Namespace)
		}
		return err
	}
	return nil
}

// GetFunction reads one Function.
func (s *Standalone) GetFunction(ctx context.Context, namespace, name string) (*v1alpha1.Function, error) {
	return s.store.Functions().Get(ctx, namespace, name)
}

// ListFunctions lists Functions.
func (s *Standalone) ListFunctions(ctx context.Context, opts store.ListOptions) ([]*v1alpha1.Function, string, error) {
	return s.store.Functions().List(ctx, opts)
}

// WatchFunctions watches Functions from a resource version.
func (s *Standalone) WatchFunctions(ctx context.Context, opts store.WatchOptions) (store.Watcher[*v1alpha1.Function], error) {
	return s.store.Functions().Watch(ctx, opts)
}

// DeleteFunction deletes a Function and returns it as it was; the Function
// controller then deletes its replicas (each drains and unregisters).
func (s *Standalone) DeleteFunction(ctx context.Context, namespace, name string) (*v1alpha1.Function, error) {
	fn, err := s.store.Functions().Get(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	err = s.store.Functions().Delete(ctx, namespace, name, store.DeleteOptions{Preconditions: store.Preconditions{UID: string(fn.UID)}})
	return fn, err
}
