package errdefs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

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
		{Errorf(ErrUnavailable, "gone"), codes.Unavailable, 503},
		{Errorf(ErrResourceExhausted, "busy"), codes.ResourceExhausted, 429},
		{Errorf(ErrDeadlineExceeded, "slow"), codes.DeadlineExceeded, 504},
		{Errorf(ErrTooLarge, "big"), codes.InvalidArgument, 413},
		{Errorf(ErrUnauthenticated, "who"), codes.Unauthenticated, 401},
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
