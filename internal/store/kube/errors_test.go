package kube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"syscall"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"stoke.dev/stoke/internal/errdefs"
)

// TestCategory checks the one mapping from what client-go returns to the
// store's error categories, with the errors the API server sends for each
// case (built the way the API server builds them).
func TestCategory(t *testing.T) {
	gr := schema.GroupResource{Group: "stoke.dev", Resource: "runs"}
	refused := &url.Error{Op: "Get", URL: "https://127.0.0.1:1", Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"Conflict", apierrors.NewConflict(gr, "x", errors.New("the object has been modified")), errdefs.ErrConflict},
		{"AlreadyExists", apierrors.NewAlreadyExists(gr, "x"), errdefs.ErrAlreadyExists},
		{"NotFound", apierrors.NewNotFound(gr, "x"), errdefs.ErrNotFound},
		// What client-go makes of the API server's plain-text 404 for a
		// CRD it does not serve yet.
		{"NotServed", apierrors.NewGenericServerResponse(404, "GET", gr, "x", "404 page not found", 0, true), errdefs.ErrUnavailable},
		{"Gone", &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonGone}}, errdefs.ErrExpired},
		{"ResourceExpired", apierrors.NewResourceExpired("too old resource version: 1 (5)"), errdefs.ErrExpired},
		{"Invalid", apierrors.NewInvalid(schema.GroupKind{Group: "stoke.dev", Kind: "Run"}, "x", field.ErrorList{field.Required(field.NewPath("spec"), "")}), errdefs.ErrInvalidArgument},
		{"BadRequest", apierrors.NewBadRequest("bad"), errdefs.ErrInvalidArgument},
		{"EntityTooLarge", apierrors.NewRequestEntityTooLargeError("limit is 3145728"), errdefs.ErrTooLarge},
		{"EtcdTooLarge", apierrors.NewInternalError(errors.New("etcdserver: request is too large")), errdefs.ErrTooLarge},
		{"Unauthorized", apierrors.NewUnauthorized("no token"), errdefs.ErrUnauthenticated},
		{"Forbidden", apierrors.NewForbidden(gr, "x", errors.New("RBAC")), errdefs.ErrPermissionDenied},
		{"ServiceUnavailable", apierrors.NewServiceUnavailable("etcd is down"), errdefs.ErrUnavailable},
		{"Timeout", apierrors.NewTimeoutError("slow", 1), errdefs.ErrUnavailable},
		{"ServerTimeout", apierrors.NewServerTimeout(gr, "create", 1), errdefs.ErrUnavailable},
		{"TooManyRequests", apierrors.NewTooManyRequests("APF", 1), errdefs.ErrUnavailable},
		{"Internal", apierrors.NewInternalError(errors.New("boom")), errdefs.ErrInternal},
		{"ConnectionRefused", refused, errdefs.ErrUnavailable},
		{"Canceled", fmt.Errorf("get: %w", context.Canceled), errdefs.ErrCanceled},
		{"Deadline", fmt.Errorf("get: %w", context.DeadlineExceeded), errdefs.ErrDeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := category(tc.err); got != tc.want {
				t.Fatalf("category(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
