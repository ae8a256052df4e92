package errdefs

import (
	"errors"
	"time"
)

// MaxRetryAfter caps a Retry-After that comes from a peer (FromGRPC).
const MaxRetryAfter = time.Hour

// WithRetryAfter marks err as transient: the same request may succeed when
// sent again after d (for example a function registered again after a
// restart). Its category is err's; the gateway answers it with a
// Retry-After header in whole seconds (at least 1).
func WithRetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &retryAfter{err: err, after: d}
}

// RetryAfter returns the delay WithRetryAfter put on err (or on an error
// it wraps), and whether there is one.
func RetryAfter(err error) (time.Duration, bool) {
	var ra *retryAfter
	if errors.As(err, &ra) {
		return ra.after, true
	}
	return 0, false
}

// RetryAfterSeconds is RetryAfter in the whole seconds of an HTTP
// Retry-After header: rounded up, at least 1.
func RetryAfterSeconds(err error) (int, bool) {
	d, ok := RetryAfter(err)
	if !ok {
		return 0, false
	}
	return max(1, int((d+time.Second-1)/time.Second)), true
}

type retryAfter struct {
	err   error
	after time.Duration
}

func (e *retryAfter) Error() string { return e.err.Error() }
func (e *retryAfter) Unwrap() error { return e.err }
