//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package sqlite

import "os"

// lockDir is a no-op where flock does not exist; running two processes on
// one data directory there is the operator's mistake to avoid.
func lockDir(string) (*os.File, error) { return nil, nil }
