package errdefs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestMapping(t *testing.T) {
	tests := []struct {
		err  error
		code codes.Code
		http int
	}{
		{nil, codes.OK, http.StatusOK},
		{Errorf(ErrInvalidArgument, "x"), codes.InvalidArgument, 400},
		{fmt.Errorf("wrapped: %w", Errorf(ErrNotFound, "run a")), codes.NotFound, 404},
		{Errorf(ErrFailedPrecondition, "draining"), codes.FailedPrecondition, 503},
		{Errorf(ErrNotRunning, "finished"), codes.FailedPrecondition, 409},
		{Errorf(ErrUnavailable, "gone"), codes.Unavailable, 503},
		{Errorf(ErrResourceExhausted, "busy"), codes.ResourceExhausted, 429},
		{Errorf(ErrDeadlineExceeded, "slow"), codes.DeadlineExceeded, 504},
		{Errorf(ErrTooLarge, "big"), codes.InvalidArgument, 413},
		{Errorf(ErrUnauthenticated, "who"), codes.Unauthenticated, 401},
		{Errorf(ErrPermissionDenied, "cross-origin"), codes.PermissionDenied, 403},
		{Errorf(ErrConflict, "stale rv"), codes.Aborted, 409},
		{Errorf(ErrExpired, "too old"), codes.OutOfRange, 410},
		{Errorf(ErrMethodNotAllowed, "PUT"), codes.Unimplemented, 405},
		{Errorf(ErrUnimplemented, "later"), codes.Unimplemented, 501},
		{&FunctionError{Type: "ValueError", Message: "boom"}, codes.Unknown, 500},
		{context.DeadlineExceeded, codes.DeadlineExceeded, 504},
		{errors.New("surprise"), codes.Internal, 500},
	}
	for _, tt := range tests {
		if got := Code(tt.err); got != tt.code {
			t.Errorf("Code(%v) = %v, want %v", tt.err, got, tt.code)
		}
		if got := HTTPStatus(tt.err); got != tt.http {
			t.Errorf("HTTPStatus(%v) = %d, want %d", tt.err, got, tt.http)
		}
	}
}

// A status crossing a gRPC hop keeps its category, so that runtimed and the
// gateway can re-map it; a FUNCTION_ERROR keeps its type, message, stack
// trace and invocation ID.
func TestRoundTrip(t *testing.T) {
	for _, cat := range []error{ErrInvalidArgument, ErrNotFound, ErrFailedPrecondition, ErrResourceExhausted, ErrDeadlineExceeded, ErrUnavailable, ErrConflict} {
		back := FromGRPC(ToGRPC(Errorf(cat, "msg")))
		if !errors.Is(back, cat) || back.Error() != "msg" {
			t.Errorf("%v came back as %v", cat, back)
		}
	}
	fe := &FunctionError{Type: "ValueError", Message: "boom", StackTrace: "Traceback...", InvocationID: "inv1"}
	st := status.Convert(ToGRPC(fe))
	if st.Code() != codes.Unknown || st.Message() != "ValueError: boom" {
		t.Fatalf("status %v", st)
	}
	var back *FunctionError
	if !errors.As(FromGRPC(st.Err()), &back) || *back != *fe {
		t.Fatalf("function error came back as %#v", back)
	}
	// A status that is already a gRPC status passes through unchanged.
	orig := status.Error(codes.PermissionDenied, "no")
	if ToGRPC(orig) != orig {
		t.Fatal("ToGRPC rewrote a status error")
	}
}

// FromHTTP gives back the category of every row, the gRPC code telling
// apart the rows that share a status.
func TestFromHTTP(t *testing.T) {
	for _, c := range categories {
		if got := FromHTTP(c.http, c.code.String()); got != c.err {
			t.Errorf("FromHTTP(%d, %s) = %v, want %v", c.http, c.code, got, c.err)
		}
	}
	if got := FromHTTP(http.StatusTeapot, ""); got != nil {
		t.Errorf("FromHTTP(418) = %v, want nil", got)
	}
}

func TestRetryAfter(t *testing.T) {
	base := Errorf(ErrUnavailable, "run a/b is Pending, not Ready")
	err := fmt.Errorf("route: %w", WithRetryAfter(base, 1500*time.Millisecond))
	if d, ok := RetryAfter(err); !ok || d != 1500*time.Millisecond {
		t.Errorf("RetryAfter = %v, %v; want 1.5s, true", d, ok)
	}
	if s, ok := RetryAfterSeconds(err); !ok || s != 2 {
		t.Errorf("RetryAfterSeconds = %d, %v; want 2, true", s, ok)
	}
	if s, _ := RetryAfterSeconds(WithRetryAfter(base, 0)); s != 1 {
		t.Errorf("RetryAfterSeconds of 0 = %d, want 1", s)
	}
	if HTTPStatus(err) != http.StatusServiceUnavailable || !errors.Is(err, ErrUnavailable) || err.Error() != "route: "+base.Error() {
		t.Errorf("the category or message changed: %d %v %q", HTTPStatus(err), errors.Is(err, ErrUnavailable), err)
	}
	if _, ok := RetryAfter(base); ok {
		t.Error("RetryAfter of an unmarked error is set")
	}
	if WithRetryAfter(nil, time.Second) != nil {
		t.Error("WithRetryAfter(nil) is not nil")
	}
}

// A Retry-After crosses a gRPC hop (runtimed to the Kubernetes gateway) as
// a RetryInfo, with its category and message; an unmarked error gets none,
// and a peer's absurd delay is capped.
func TestRetryAfterCrossesGRPC(t *testing.T) {
	for _, cat := range []error{ErrUnavailable, ErrFailedPrecondition, ErrResourceExhausted} {
		back := FromGRPC(ToGRPC(fmt.Errorf("hop: %w", WithRetryAfter(Errorf(cat, "not yet"), 2500*time.Millisecond))))
		if d, ok := RetryAfter(back); !ok || d != 2500*time.Millisecond {
			t.Errorf("%v: RetryAfter after the hop = %v, %v; want 2.5s", cat, d, ok)
		}
		if !errors.Is(back, cat) || back.Error() != "hop: not yet" {
			t.Errorf("%v came back as %v", cat, back)
		}
		if _, ok := RetryAfter(FromGRPC(ToGRPC(Errorf(cat, "no")))); ok {
			t.Errorf("%v without a Retry-After came back with one", cat)
		}
	}
	fe := &FunctionError{Type: "ValueError", Message: "boom", InvocationID: "inv1"}
	var back *FunctionError
	if err := FromGRPC(ToGRPC(WithRetryAfter(fe, time.Second))); !errors.As(err, &back) || *back != *fe {
		t.Errorf("a function error with a Retry-After came back as %v", err)
	}
	if d, _ := RetryAfter(FromGRPC(ToGRPC(WithRetryAfter(Errorf(ErrUnavailable, "x"), 1000*time.Hour)))); d != MaxRetryAfter {
		t.Errorf("a delay of 1000 h came back as %v, want MaxRetryAfter", d)
	}
}

// A NotRun refusal crosses a gRPC hop with its category, message and
// Retry-After; an unmarked error of the same category does not come back
// marked.
func TestNotRunCrossesGRPC(t *testing.T) {
	for _, cat := range []error{ErrNotFound, ErrFailedPrecondition} {
		err := fmt.Errorf("hop: %w", NotRun(WithRetryAfter(Errorf(cat, "no registration"), time.Second)))
		if !WasNotRun(err) || !errors.Is(err, cat) {
			t.Fatalf("%v: NotRun lost its mark or category: %v", cat, err)
		}
		back := FromGRPC(ToGRPC(err))
		if !WasNotRun(back) || !errors.Is(back, cat) || back.Error() != "hop: no registration" {
			t.Errorf("%v came back as %v (not run: %v)", cat, back, WasNotRun(back))
		}
		if d, ok := RetryAfter(back); !ok || d != time.Second {
			t.Errorf("%v: RetryAfter after the hop = %v, %v", cat, d, ok)
		}
		if WasNotRun(FromGRPC(ToGRPC(Errorf(cat, "ran")))) {
			t.Errorf("%v without the mark came back marked", cat)
		}
	}
	if NotRun(nil) != nil {
		t.Error("NotRun(nil) is not nil")
	}
}
