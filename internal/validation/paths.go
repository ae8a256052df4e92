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
// bytes, and naming a file in it — not the directory itself (".") nor a
// directory ("a/", "a/.").
func RelativePath(field, p string) error {
	switch {
	case p == "":
		return errdefs.InvalidArgument(field, "must not be empty")
	case len(p) > bounds.Path:
		return errdefs.InvalidArgument(field, "is %d bytes, at most %d allowed", len(p), bounds.Path)
	case strings.IndexByte(p, 0) >= 0:
		return errdefs.InvalidArgument(field, "contains a NUL byte")
	case filepath.IsAbs(p):
		return errdefs.InvalidArgument(field, "%s must be relative to the working directory", bounds.Quote(p))
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return errdefs.InvalidArgument(field, "%s must not contain '..'", bounds.Quote(p))
		}
	}
	if last := p[strings.LastIndexByte(p, '/')+1:]; last == "" || last == "." {
		return errdefs.InvalidArgument(field, "%s names a directory, not a file in the working directory", bounds.Quote(p))
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
			return errdefs.InvalidArgument(field, "key %s must match [A-Za-z_][A-Za-z0-9_]*", bounds.Quote(k))
		}
		if strings.IndexByte(v, 0) >= 0 {
			return errdefs.InvalidArgument(field, "value of %s contains a NUL byte", bounds.Quote(k))
		}
	}
	return nil
}
