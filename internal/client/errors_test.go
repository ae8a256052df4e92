package client_test

import (
	"errors"
	"net/http"
	"testing"

	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/errdefs"
)

// Category must undo errdefs' one mapping table for every category, from
// the status and errorType a server writes for it.
func TestCategoryInvertsErrdefs(t *testing.T) {
	for _, cat := range []error{
		errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrAlreadyExists, errdefs.ErrFailedPrecondition,
		errdefs.ErrResourceExhausted, errdefs.ErrDeadlineExceeded, errdefs.ErrUnavailable, errdefs.ErrUnimplemented, errdefs.ErrMethodNotAllowed,
		errdefs.ErrCanceled, errdefs.ErrTooLarge, errdefs.ErrUnauthenticated, errdefs.ErrInternal, errdefs.ErrConflict,
		errdefs.ErrExpired,
	} {
		t.Run(cat.Error(), func(t *testing.T) {
			err := errdefs.Errorf(cat, "x")
			status, errorType := errdefs.HTTPStatus(err), "Stoke."+errdefs.Code(err).String()
			if got := client.Category(status, errorType); !errors.Is(got, cat) {
				t.Errorf("Category(%d, %q) = %v, want %v", status, errorType, got, cat)
			}
		})
	}
}

func TestCategoryOfOtherStatuses(t *testing.T) {
	for _, tc := range []struct {
		status int
		want   error
	}{
		{http.StatusConflict, errdefs.ErrAlreadyExists},
		{http.StatusServiceUnavailable, errdefs.ErrUnavailable},
		{http.StatusForbidden, errdefs.ErrPermissionDenied},
		{http.StatusMethodNotAllowed, errdefs.ErrMethodNotAllowed},
		{http.StatusBadGateway, errdefs.ErrUnavailable},
		{http.StatusTeapot, errdefs.ErrInvalidArgument},
		{599, errdefs.ErrInternal},
	} {
		if got := client.Category(tc.status, ""); !errors.Is(got, tc.want) {
			t.Errorf("Category(%d) = %v, want %v", tc.status, got, tc.want)
		}
	}
}
