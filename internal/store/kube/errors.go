package kube

import (
	"context"
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/internal/errdefs"
)

// errorf names the object and wraps category.
func (r *resource[T]) errorf(namespace, name string, category error, format string, args ...any) error {
	return fmt.Errorf("%s %s/%s: %s: %w", r.k.noun, namespace, name, fmt.Sprintf(format, args...), category)
}

// fail turns an API call's error for one object into the store's: the
// object named, the API server's message, the errdefs category.
func (r *resource[T]) fail(verb, namespace, name string, err error) error {
	if r.s.isClosed(err) {
		return errClosed()
	}
	return r.errorf(namespace, name, category(err), "%s: %s", verb, message(err))
}

// failList is fail for a call about many objects (list, watch).
func (r *resource[T]) failList(namespace string, err error) error {
	if r.s.isClosed(err) {
		return errClosed()
	}
	where := "all namespaces"
	if namespace != "" {
		where = namespace
	}
	return fmt.Errorf("%ss in %s: %s: %w", r.k.noun, where, message(err), category(err))
}

// message is the API server's message for an API error, the error itself
// otherwise.
func message(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		if msg := status.Status().Message; msg != "" {
			return msg
		}
	}
	return err.Error()
}

// category maps an error from client-go to the errdefs category the store
// promises; internal/errdefs then maps that once to gRPC and HTTP.
func category(err error) error {
	switch {
	case errors.Is(err, context.Canceled):
		return errdefs.ErrCanceled
	case errors.Is(err, context.DeadlineExceeded):
		return errdefs.ErrDeadlineExceeded
	case apierrors.IsAlreadyExists(err):
		return errdefs.ErrAlreadyExists
	case apierrors.IsConflict(err):
		return errdefs.ErrConflict
	case apierrors.IsNotFound(err) && notServed(err):
		// The API server does not serve the CRD (yet: a starting server
		// installs CRD paths after /readyz; or not at all): nothing says
		// the object is missing.
		return errdefs.ErrUnavailable
	case apierrors.IsNotFound(err):
		return errdefs.ErrNotFound
	case apierrors.IsResourceExpired(err), apierrors.IsGone(err):
		return errdefs.ErrExpired
	case apierrors.IsRequestEntityTooLargeError(err),
		// etcd's own limit comes back as an internal error.
		strings.Contains(err.Error(), "request is too large"):
		return errdefs.ErrTooLarge
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return errdefs.ErrInvalidArgument
	case apierrors.IsUnauthorized(err):
		return errdefs.ErrUnauthenticated
	case apierrors.IsForbidden(err):
		return errdefs.ErrPermissionDenied
	case apierrors.IsServiceUnavailable(err), apierrors.IsTimeout(err), apierrors.IsServerTimeout(err), apierrors.IsTooManyRequests(err):
		return errdefs.ErrUnavailable
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return errdefs.ErrInternal
	}
	// Not an answer from the API server: the connection was refused,
	// reset or timed out.
	return errdefs.ErrUnavailable
}

// notServed reports whether a 404 is the API server's plain "404 page not
// found" for a path it does not serve, rather than a Status naming a
// missing object.
func notServed(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return false
	}
	if d := status.Status().Details; d != nil {
		for _, c := range d.Causes {
			if c.Type == metav1.CauseTypeUnexpectedServerResponse {
				return true
			}
		}
	}
	return false
}
