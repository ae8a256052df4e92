package errdefs

import "errors"

// NotRunReason is the google.rpc.ErrorInfo reason (domain ErrorDomain) of
// a refusal made before the request ran (NotRun).
const NotRunReason = "NOT_RUN"

// NotRun marks err as a refusal made before the request ran: an
// invocation refused by a replica whose registration is gone, not
// registered yet, or whose Runtime Server is not answering. Sending the
// same request to another replica cannot run it twice, so the Function
// gateway does (the contract's rule is never to retry after dispatch,
// and this was never dispatched to user code). Its category is err's; it
// crosses a gRPC hop (ToGRPC, FromGRPC) as an ErrorInfo detail.
func NotRun(err error) error {
	if err == nil {
		return nil
	}
	return &notRun{err: err}
}

// WasNotRun reports whether err (or an error it wraps) is marked NotRun.
func WasNotRun(err error) bool {
	var nr *notRun
	return errors.As(err, &nr)
}

type notRun struct{ err error }

func (e *notRun) Error() string { return e.err.Error() }
func (e *notRun) Unwrap() error { return e.err }
