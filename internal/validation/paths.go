package validation

import (
	"path/filepath"
	"regexp"
	"strings"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

var envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// RelativePath checks a path given relative to the working
// directory: not absolute, no ".." element, no NUL, at most bounds.Path
// bytes.
func RelativePath(field, p string) error {
	switch {
	case p == "":
		return errdefs.InvalidArgument(field, "must not be empty")
	case len(p) > bounds.Path:
		return errdefs.InvalidArgument(field, "is %d bytes, at most %d allowed", len(p), bounds.Path)
	case strings.IndexByte(p, 0) >= 0:
		return errdefs.InvalidArgument(field, "contains a NUL byte")
	case filepath.IsAbs(p):
		return errdefs.InvalidArgument(field, "%q must be relative to the working directory", p)
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return errdefs.InvalidArgument(field, "%q must not contain '..'", p)
		}
	}
	return nil
}

// Env checks a map of environment keys and values.
func Env(field string, env map[string]string) error {
	if len(env) > bounds.EnvEntries {
		return errdefs.InvalidArgument(field, "%d entries, at most %d allowed", len(env), bounds.EnvEntries)
	}
	for k, v := range env {
		if !envKeyRE.MatchString(k) {
			return errdefs.InvalidArgument(field, "key %q must match [A-Za-z_][A-Za-z0-9_]*", k)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return errdefs.InvalidArgument(field, "value of %q contains a NUL byte", k)
		}
	}
	return nil
}
