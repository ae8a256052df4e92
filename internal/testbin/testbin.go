// Package testbin builds Stoke's own binaries for tests that run them as
// real processes — the e2e tests, the pool supervisor's pods, the
// standalone control plane — once per test binary, from TestMain, and
// runs `stoke up` as a child process for tests that need a real server
// (StartUp), and tells benchmarks when the Python Runtime Servers' spare
// workers are idle (PythonSparesIdle). It does not use package testing: it returns errors, so that
// TestMain can use it too.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Build runs `go build` for pkg (an import path; with modfile set, resolved
// through that module file, relative to the module root) into a new
// temporary directory. It returns the binary's path and a function that
// removes the directory.
func Build(pkg, modfile string) (path string, cleanup func(), err error) {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", nil, fmt.Errorf("go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	dir, err := os.MkdirTemp("", "stoke-testbin-")
	if err != nil {
		return "", nil, err
	}
	cleanup = func() { os.RemoveAll(dir) }
	// Searchable by all, as an installed stoke is: Runs (as their own
	// user) run it for Stoke's own steps (a workflow's hash Run).
	if err := os.Chmod(dir, 0o711); err != nil {
		cleanup()
		return "", nil, err
	}
	path = filepath.Join(dir, filepath.Base(pkg))
	args := []string{"build", "-o", path}
	if modfile != "" {
		args = append(args, "-modfile="+modfile)
	}
	cmd := exec.Command("go", append(args, pkg)...)
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("go build %s: %w", pkg, err)
	}
	return path, cleanup, nil
}

// Stoke builds the stoke command.
func Stoke() (path string, cleanup func(), err error) {
	return Build("stoke.dev/stoke/cmd/stoke", "")
}

// LambdaBootstrap builds cmd/stoke-lambda-bootstrap into dir (a stoke
// binary's directory, where a lambda Runtime Server looks for it) the way
// `make build` and the Dockerfile do: stripped, without build paths.
func LambdaBootstrap(dir string) (path string, err error) {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	path = filepath.Join(dir, "stoke-lambda-bootstrap")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", path, "stoke.dev/stoke/cmd/stoke-lambda-bootstrap")
	cmd.Dir = filepath.Dir(strings.TrimSpace(string(gomod)))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build stoke-lambda-bootstrap: %w", err)
	}
	return path, nil
}
