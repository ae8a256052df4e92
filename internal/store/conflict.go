package store

import (
	"context"
	"errors"
	"fmt"

	"stoke.dev/stoke/internal/errdefs"
)

// ConflictBudget is how many times RetryOnConflict tries one
// read-modify-write before a conflict counts as a failure. Each conflict
// means another writer got in between; that many in a row means a writer
// that never yields, and the caller's own retry (or the user) takes over.
const ConflictBudget = 16

// RetryOnConflict runs attempt, a read-modify-write of one object, until it
// returns anything but an errdefs.ErrConflict error: nil, another error, or
// the last conflict once ConflictBudget attempts conflicted, then wrapped
// with "too many conflicts" (still ErrConflict). Attempt re-reads the object
// itself, so that every try starts from what is stored.
func RetryOnConflict(attempt func() error) error {
	var err error
	for range ConflictBudget {
		if err = attempt(); !errors.Is(err, errdefs.ErrConflict) {
			return err
		}
	}
	return fmt.Errorf("too many conflicts (%d attempts): %w", ConflictBudget, err)
}

// CreateOrUpdate stores obj under its name: it creates it when no object
// of that name exists, else it updates the stored one with what update
// returns from it (the caller carries obj's spec and labels over and
// checks the change), retrying on conflicts as RetryOnConflict does. A
// create that races another's is retried as an update.
func CreateOrUpdate[T Object](ctx context.Context, r Resource[T], obj T, update func(cur T) (T, error)) (T, error) {
	var out T
	err := RetryOnConflict(func() error {
		cur, err := r.Get(ctx, obj.GetNamespace(), obj.GetName())
		if errors.Is(err, errdefs.ErrNotFound) {
			out, err = r.Create(ctx, obj)
			if errors.Is(err, errdefs.ErrAlreadyExists) {
				return errdefs.Errorf(errdefs.ErrConflict, "%s/%s: created concurrently", obj.GetNamespace(), obj.GetName())
			}
			return err
		}
		if err != nil {
			return err
		}
		next, err := update(cur)
		if err != nil {
			return err
		}
		out, err = r.Update(ctx, next)
		return err
	})
	if err != nil {
		var zero T
		return zero, err
	}
	return out, nil
}
