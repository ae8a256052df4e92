package docker

import (
	"net/http"

	"github.com/moby/moby/api/types/common"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

// writeError answers with Docker's error shape, {"message": ...}, and the
// status of the error's category (errdefs, the one mapping). Only before a
// stream starts: after a hijack the client would show "unrecognized
// stream" instead.
func writeError(w http.ResponseWriter, err error) {
	writeJSON(w, errdefs.HTTPStatus(err), common.ErrorResponse{Message: bounds.Echo(err.Error())})
}

func notFoundPath(r *http.Request) error {
	return errdefs.Errorf(errdefs.ErrNotFound, "page not found: %s %s is not part of the Docker API that Stoke serves (docs/docker.md lists it)", r.Method, bounds.Quote(r.URL.Path))
}

// noSuchContainer is Docker's own message for an unknown container.
func noSuchContainer(ref string) error {
	return errdefs.Errorf(errdefs.ErrNotFound, "No such container: %s", bounds.Truncate(ref, bounds.Quoted))
}

// noSuchImage is Docker's own message for an unmapped image.
func noSuchImage(ref string) error {
	return errdefs.Errorf(errdefs.ErrNotFound, "No such image: %s", bounds.Truncate(ref, bounds.Quoted))
}

func errNotRunning(c *ctr) error {
	return errdefs.Errorf(errdefs.ErrNotRunning, "container %s is not running", c.id)
}
