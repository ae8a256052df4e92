package store

import (
	"errors"
	"testing"

	"stoke.dev/stoke/internal/errdefs"
)

func TestRetryOnConflict(t *testing.T) {
	conflict := errdefs.Errorf(errdefs.ErrConflict, "run default/a: resourceVersion 1 is stale")
	other := errors.New("disk full")
	for _, tc := range []struct {
		name    string
		results []error // what the attempts return, in order; the last repeats
		calls   int
		want    error
	}{
		{"success at once", []error{nil}, 1, nil},
		{"success after conflicts", []error{conflict, conflict, nil}, 3, nil},
		{"another error ends it", []error{conflict, other}, 2, other},
		{"the budget ends it", []error{conflict}, ConflictBudget, conflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			err := RetryOnConflict(func() error {
				r := tc.results[min(calls, len(tc.results)-1)]
				calls++
				return r
			})
			if calls != tc.calls {
				t.Errorf("%d attempts, want %d", calls, tc.calls)
			}
			if (err == nil) != (tc.want == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
		})
	}
}
