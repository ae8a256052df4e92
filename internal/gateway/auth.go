package gateway

import (
	"crypto/subtle"
	"net/http"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/httpapi"
)

// Access is what a request asks to do, in the terms of a Kubernetes
// authorization check: a verb on a resource (and subresource) of a
// namespace, or on a non-resource path. The zero Access asks nothing but
// that the caller be authenticated.
type Access struct {
	Verb        string
	Resource    string
	Subresource string
	Namespace   string
	Name        string
	// Path is a non-resource URL ("/metrics"); Resource is then empty.
	Path string
}

// Authorizer decides whether a request may go on. Its error is
// ErrUnauthenticated (401: no credential, or one nobody knows),
// ErrPermissionDenied (403: known, without the right) or a failure to
// decide (Unavailable while the authority cannot be asked). It never
// logs the credential.
type Authorizer interface {
	Authorize(r *http.Request, a Access) error
}

// TokenAuth is standalone's Authorizer: every request carries the one
// bearer token, which allows everything.
func TokenAuth(token string) Authorizer { return tokenAuth(token) }

type tokenAuth string

func (t tokenAuth) Authorize(r *http.Request, _ Access) error {
	token, err := BearerToken(r)
	if err != nil {
		return err
	}
	if t == "" || subtle.ConstantTimeCompare([]byte(token), []byte(t)) != 1 {
		return errdefs.Errorf(errdefs.ErrUnauthenticated, "missing or wrong bearer token")
	}
	return nil
}

// BearerToken is the request's bearer token: ErrUnauthenticated without
// one, ErrInvalidArgument when it is longer than bounds.BearerToken (no
// authority is asked about it).
func BearerToken(r *http.Request) (string, error) {
	token, ok := httpapi.BearerToken(r.Header.Get("Authorization"))
	if !ok {
		return "", errdefs.Errorf(errdefs.ErrUnauthenticated, "missing or wrong bearer token")
	}
	if len(token) > bounds.BearerToken {
		return "", errdefs.InvalidArgument("Authorization", "the bearer token is %d bytes, at most %d allowed", len(token), bounds.BearerToken)
	}
	return token, nil
}
