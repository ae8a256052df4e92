package server

import (
	"fmt"
	"slices"
	"strings"

	"stoke.dev/stoke/internal/validation"
)

// HandlerEnvAll, as the one name given to HandlerEnvFrom, passes the
// server's whole environment: a Runtime in a user's image, whose ENV
// (PATH, PYTHONPATH, VIRTUAL_ENV, …) is how its packages are found.
const HandlerEnvAll = "*"

// perRun are what every handler gets from its Run, never from the
// server: HOME is the Run's working directory, TMPDIR its private
// directory.
var perRun = []string{"HOME", "TMPDIR"}

// HandlerEnvFrom picks from environ (os.Environ's "K=V" form) the
// variables named in names, or all of them when names is [HandlerEnvAll],
// for Config.HandlerEnv: a handler never sees the rest of the server's
// environment. A name not in environ is left out, as Kubernetes leaves out
// an optional variable whose Secret key is missing; HOME and TMPDIR, and
// under "*" a name a handler's env could not carry, are always left out.
func HandlerEnvFrom(names, environ []string) (map[string]string, error) {
	if len(names) == 0 {
		return nil, nil
	}
	all := len(names) == 1 && names[0] == HandlerEnvAll
	if !all {
		for _, n := range names {
			if err := validation.Env("--handler-env", map[string]string{n: ""}); err != nil {
				return nil, fmt.Errorf("%w (or %q alone for the whole environment)", err, HandlerEnvAll)
			}
		}
	}
	out := map[string]string{}
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || slices.Contains(perRun, k) || (!all && !slices.Contains(names, k)) {
			continue
		}
		if validation.Env("", map[string]string{k: v}) != nil {
			continue
		}
		out[k] = v
	}
	return out, nil
}
