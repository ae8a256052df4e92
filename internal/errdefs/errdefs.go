// Package errdefs defines Stoke's error categories and translates them, once,
// to gRPC status codes (at every gRPC edge) and to HTTP statuses (at the
// gateway). Code inside Stoke wraps a category with %w; only the edges look at
// codes.
package errdefs

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Error categories. Wrap them with fmt.Errorf("...: %w", ErrX) or use the
// constructor helpers below, which name the category in one call.
var (
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrFailedPrecondition = errors.New("failed precondition")
	// ErrNotRunning means the operation needs a running task or a Ready
	// function and the Run is in another phase (exec into a finished Run).
	ErrNotRunning        = errors.New("not running")
	ErrResourceExhausted = errors.New("resource exhausted")
	ErrDeadlineExceeded  = errors.New("deadline exceeded")
	ErrUnavailable       = errors.New("unavailable")
	ErrUnimplemented     = errors.New("unimplemented")
	// ErrMethodNotAllowed is an HTTP method the path does not serve.
	ErrMethodNotAllowed = errors.New("method not allowed")
	ErrCanceled         = errors.New("canceled")
	ErrTooLarge         = errors.New("too large")
	ErrUnauthenticated  = errors.New("unauthenticated")
	// ErrPermissionDenied refuses an authenticated request (a cross-origin
	// WebSocket upgrade).
	ErrPermissionDenied = errors.New("permission denied")
	ErrInternal         = errors.New("internal error")
	// ErrConflict is an optimistic-concurrency failure: the object changed
	// since it was read (its resourceVersion is stale). Callers re-read and
	// retry.
	ErrConflict = errors.New("conflict")
	// ErrExpired means a watch asked for history that is no longer kept;
	// the watcher must re-list.
	ErrExpired = errors.New("expired")
)

// categories maps each category to its gRPC code and HTTP status. It is the
// one translation table; docs/http-api.md ("Errors") is its spec.
// Where two categories share a status, the first listed is what FromHTTP
// answers when the gRPC code does not tell them apart.
var categories = []struct {
	err  error
	code codes.Code
	http int
}{
	{ErrInvalidArgument, codes.InvalidArgument, http.StatusBadRequest},
	{ErrNotFound, codes.NotFound, http.StatusNotFound},
	{ErrAlreadyExists, codes.AlreadyExists, http.StatusConflict},
	{ErrUnavailable, codes.Unavailable, http.StatusServiceUnavailable},
	{ErrFailedPrecondition, codes.FailedPrecondition, http.StatusServiceUnavailable},
	{ErrNotRunning, codes.FailedPrecondition, http.StatusConflict},
	{ErrResourceExhausted, codes.ResourceExhausted, http.StatusTooManyRequests},
	{ErrDeadlineExceeded, codes.DeadlineExceeded, http.StatusGatewayTimeout},
	{ErrUnimplemented, codes.Unimplemented, http.StatusNotImplemented},
	{ErrMethodNotAllowed, codes.Unimplemented, http.StatusMethodNotAllowed},
	{ErrCanceled, codes.Canceled, 499}, // nginx's "client closed request"
	{ErrTooLarge, codes.InvalidArgument, http.StatusRequestEntityTooLarge},
	{ErrUnauthenticated, codes.Unauthenticated, http.StatusUnauthorized},
	{ErrPermissionDenied, codes.PermissionDenied, http.StatusForbidden},
	{ErrInternal, codes.Internal, http.StatusInternalServerError},
	{ErrConflict, codes.Aborted, http.StatusConflict},
	{ErrExpired, codes.OutOfRange, http.StatusGone},
}

// Errorf formats a message and tags it with category: the message is
// exactly what was formatted (so a gRPC or HTTP status carries no
// ": not found" suffix), and errors.Is(err, category) holds.
func Errorf(category error, format string, args ...any) error {
	return &categorized{msg: fmt.Sprintf(format, args...), category: category}
}

type categorized struct {
	msg      string
	category error
}

func (e *categorized) Error() string { return e.msg }
func (e *categorized) Unwrap() error { return e.category }

// InvalidArgument reports a bad field; the message names the field.
func InvalidArgument(field, format string, args ...any) error {
	return Errorf(ErrInvalidArgument, "%s: %s", field, fmt.Sprintf(format, args...))
}

// FunctionErrorReason is the google.rpc.ErrorInfo reason of a handler failure.
const FunctionErrorReason = "FUNCTION_ERROR"

// ErrorDomain is the google.rpc.ErrorInfo domain of Stoke's own errors.
const ErrorDomain = "stoke.dev"

// FunctionError is a failure of user code during one invocation: a Python
// exception, a non-zero Bash exit, output that is not JSON or is too large.
// It never changes the registration's state. On gRPC it is codes.Unknown
// with an ErrorInfo detail (reason FUNCTION_ERROR) and, when the runtime
// gives one, a DebugInfo detail carrying the stack trace.
type FunctionError struct {
	Type         string // errorType, e.g. "ValueError" or "Runtime.ExitError"
	Message      string // bounded
	StackTrace   string // bounded; may be empty
	InvocationID string
}

// The FunctionError types of failures the runtime itself detects, as
// opposed to the handler's own exceptions: the same for every adapter (the
// Python worker sends the same strings; its tests check them).
const (
	// RuntimeExitError: the handler exited non-zero, or the runtime process
	// died during the invocation.
	RuntimeExitError = "Runtime.ExitError"
	// RuntimeProtocolError: the runtime process broke its wire protocol.
	RuntimeProtocolError = "Runtime.ProtocolError"
	// RuntimeInvalidInput: the payload could not be given to the handler.
	RuntimeInvalidInput = "Runtime.InvalidInput"
	// RuntimeInvalidOutput: the handler's result is not what it must be
	// (JSON, UTF-8).
	RuntimeInvalidOutput = "Runtime.InvalidOutput"
	// RuntimeInvalidOutputs: the outputs break the outputs rules.
	RuntimeInvalidOutputs = "Runtime.InvalidOutputs"
	// RuntimeOutputTooLarge: the result exceeds bounds.InvokeBody.
	RuntimeOutputTooLarge = "Runtime.OutputTooLarge"
)

func (e *FunctionError) Error() string {
	if e.Message == "" {
		return e.Type
	}
	return e.Type + ": " + e.Message
}

// Code returns the gRPC code for err. Errors without a category are Internal
// (a context error keeps its meaning). A gRPC status error keeps its code.
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	var fe *FunctionError
	if errors.As(err, &fe) {
		return codes.Unknown
	}
	for _, c := range categories {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	}
	if s, ok := status.FromError(err); ok {
		return s.Code()
	}
	return codes.Internal
}

// FromHTTP is the reverse of HTTPStatus, for clients: the category of an
// error answer with this status, nil for a status the table has no row
// for. code, the name of the gRPC code the server gave (see Code), picks
// between categories that share a status (409, 503).
func FromHTTP(status int, code string) error {
	var first error
	for _, c := range categories {
		if c.http != status {
			continue
		}
		if c.code.String() == code {
			return c.err
		}
		if first == nil {
			first = c.err
		}
	}
	return first
}

// HTTPStatus returns the HTTP status for err, per the gateway table.
func HTTPStatus(err error) int {
	if err == nil {
		return http.StatusOK
	}
	var fe *FunctionError
	if errors.As(err, &fe) {
		return http.StatusInternalServerError
	}
	for _, c := range categories {
		if errors.Is(err, c.err) {
			return c.http
		}
	}
	switch Code(err) {
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.Canceled:
		return 499
	}
	return http.StatusInternalServerError
}

// ToGRPC converts err into a gRPC status error at a server edge. A
// Retry-After (WithRetryAfter) crosses as an errdetails.RetryInfo, which
// FromGRPC turns back into one, so that a hop's peer (the Kubernetes
// gateway, from runtimed) answers with the same Retry-After.
func ToGRPC(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := err.(interface{ GRPCStatus() *status.Status }); ok {
		return err
	}
	var st *status.Status
	var details []protoadapt.MessageV1
	var fe *FunctionError
	if errors.As(err, &fe) {
		st = status.New(codes.Unknown, fe.Error())
		details = append(details, &errdetails.ErrorInfo{
			Reason:   FunctionErrorReason,
			Domain:   ErrorDomain,
			Metadata: map[string]string{"errorType": fe.Type, "invocationId": fe.InvocationID},
		})
		if fe.StackTrace != "" {
			details = append(details, &errdetails.DebugInfo{Detail: fe.StackTrace})
		}
	} else {
		st = status.New(Code(err), err.Error())
	}
	if WasNotRun(err) {
		details = append(details, &errdetails.ErrorInfo{Reason: NotRunReason, Domain: ErrorDomain})
	}
	if d, ok := RetryAfter(err); ok {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
	}
	if len(details) > 0 {
		if withDetails, derr := st.WithDetails(details...); derr == nil {
			st = withDetails
		}
	}
	return st.Err()
}

// FromGRPC converts a gRPC status error from a peer back into a categorized
// error, so that a hop (runtimed, the gateway) can re-map it. A FUNCTION_ERROR
// status becomes a *FunctionError again, a NOT_RUN ErrorInfo a NotRun, and
// a RetryInfo a Retry-After (WithRetryAfter).
func FromGRPC(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	back := fromStatus(st)
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetReason() == NotRunReason && ei.GetDomain() == ErrorDomain {
			back = NotRun(back)
			break
		}
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return WithRetryAfter(back, min(max(ri.GetRetryDelay().AsDuration(), 0), MaxRetryAfter))
		}
	}
	return back
}

// fromStatus is FromGRPC's category (or function error) of st.
func fromStatus(st *status.Status) error {
	if st.Code() == codes.Unknown {
		fe := &FunctionError{Message: st.Message()}
		isFunction := false
		for _, d := range st.Details() {
			switch d := d.(type) {
			case *errdetails.ErrorInfo:
				if d.GetReason() == FunctionErrorReason {
					isFunction = true
					fe.Type = d.GetMetadata()["errorType"]
					fe.InvocationID = d.GetMetadata()["invocationId"]
				}
			case *errdetails.DebugInfo:
				fe.StackTrace = d.GetDetail()
			}
		}
		if isFunction {
			// The status message is "Type: Message"; keep only the message.
			if prefix := fe.Type + ": "; len(fe.Message) >= len(prefix) && fe.Message[:len(prefix)] == prefix {
				fe.Message = fe.Message[len(prefix):]
			} else if fe.Message == fe.Type {
				fe.Message = ""
			}
			return fe
		}
	}
	for _, c := range categories {
		if c.code == st.Code() && c.err != ErrTooLarge {
			return &categorized{msg: st.Message(), category: c.err}
		}
	}
	if st.Code() == codes.DeadlineExceeded {
		return &categorized{msg: st.Message(), category: ErrDeadlineExceeded}
	}
	return &categorized{msg: st.Message(), category: ErrInternal}
}
