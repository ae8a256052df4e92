// Package testdeps builds the outside programs Stoke's tests run (the AWS
// Lambda Runtime Interface Emulator; later kube-apiserver and the like) from
// the versions pinned in tools/go.mod, once per machine: each lands in the
// user's cache directory (os.UserCacheDir()/stoke/testdeps) under a name
// that changes whenever tools/go.mod or tools/go.sum does, and a file lock
// lets concurrent test binaries build it only once. Tests call Path; CI
// prebuilds with `go run ./internal/testdeps/cmd/testdeps`. A missing
// program is built, never skipped.
package testdeps

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Programs maps a test dependency's name to the package that builds it, a
// package of the tools module (tools/go.mod): a pinned tool or a program
// of the tools module's own.
var Programs = map[string]string{
	"aws-lambda-rie": "github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie",
	// A minimal aws-lambda-go function, the Lambda benchmarks' baseline.
	"lambdaecho": "stoke.dev/stoke/tools/lambdaecho",
}

// Names lists Programs' names, sorted.
func Names() []string {
	names := make([]string, 0, len(Programs))
	for n := range Programs {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Path returns the path of the named program, building it first when the
// cache does not hold the build for the current pins.
func Path(name string) (string, error) {
	pkg, ok := Programs[name]
	if !ok {
		return "", fmt.Errorf("testdeps: unknown program %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	pin, err := pinHash(root)
	if err != nil {
		return "", err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("testdeps: %w", err)
	}
	dir := filepath.Join(cache, "stoke", "testdeps")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("testdeps: %w", err)
	}
	bin := filepath.Join(dir, name+"-"+pin)
	if isExecutable(bin) {
		return bin, nil
	}
	unlock, err := lock(filepath.Join(dir, name+".lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if isExecutable(bin) { // another process built it while we waited
		return bin, nil
	}
	tmp := bin + ".tmp"
	cmd := exec.Command("go", "build", "-o", tmp, pkg)
	cmd.Dir = filepath.Join(root, "tools")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("testdeps: go build %s: %w", pkg, err)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", fmt.Errorf("testdeps: %w", err)
	}
	return bin, nil
}

// moduleRoot finds Stoke's module root, the directory of tools/go.mod.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("testdeps: go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("testdeps: not inside Stoke's module")
	}
	return filepath.Dir(gomod), nil
}

// pinHash names the pins in force: a short hash of tools/go.mod and go.sum.
func pinHash(root string) (string, error) {
	h := sha256.New()
	for _, f := range []string{"tools/go.mod", "tools/go.sum"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return "", fmt.Errorf("testdeps: %w", err)
		}
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// lock takes an exclusive flock on path, waiting for it.
func lock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("testdeps: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("testdeps: lock %s: %w", path, err)
	}
	return func() {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}, nil
}
