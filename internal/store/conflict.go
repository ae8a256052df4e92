package store

import (
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
