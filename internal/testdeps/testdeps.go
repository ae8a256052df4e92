// Package testdeps builds the outside programs Stoke's tests run from the
// versions pinned in the project's tool modules, once per machine: the
// tools set (the AWS Lambda Runtime Interface Emulator and a baseline
// function, pinned in tools/go.mod), the kube set (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler and kubectl, pinned in
// tools/kube/go.mod) and the s3 set (versitygw, an S3-compatible server,
// pinned in tools/s3/go.mod). Each set lands in a directory of the user's cache
// directory (os.UserCacheDir()/stoke/testdeps) whose name changes whenever
// the set's go.mod or go.sum does; a file lock lets concurrent test binaries
// build it only once, and a build is renamed into place whole. Tests call
// Path or KubeDir; CI prebuilds with `go run ./internal/testdeps/cmd/testdeps`.
// A missing program is built, never skipped.
package testdeps

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
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

// KubePrograms maps the programs of KubeDir to their packages in the kube
// module (tools/kube/go.mod). The names are the ones envtest looks for.
var KubePrograms = map[string]string{
	"etcd":                    "go.etcd.io/etcd/server/v3",
	"kube-apiserver":          "k8s.io/kubernetes/cmd/kube-apiserver",
	"kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
	"kube-scheduler":          "k8s.io/kubernetes/cmd/kube-scheduler",
	"kubectl":                 "k8s.io/kubernetes/cmd/kubectl",
}

// S3Programs maps the s3 set's programs to their packages in the s3 module
// (tools/s3/go.mod).
var S3Programs = map[string]string{
	"versitygw": "github.com/versity/versitygw/cmd/versitygw",
}

// A set is the programs of one tool module, built together by one go build
// (so that they share its compilations) into one cache directory.
type set struct {
	name     string            // the cache directory's prefix
	module   string            // the module's directory, relative to Stoke's root
	programs map[string]string // program name → package
	// ldflags, when set, returns the -ldflags value for the build.
	ldflags func(moduleDir string) (string, error)
}

var sets = map[string]set{
	"tools": {name: "tools", module: "tools", programs: Programs},
	"kube":  {name: "kube", module: filepath.Join("tools", "kube"), programs: KubePrograms, ldflags: kubeLDFlags},
	"s3":    {name: "s3", module: filepath.Join("tools", "s3"), programs: S3Programs, ldflags: versitygwLDFlags},
}

// Sets lists the names Dir accepts, sorted.
func Sets() []string {
	names := make([]string, 0, len(sets))
	for n := range sets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
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

// Path returns the path of the named program of the tools set, building
// the set first when the cache does not hold the build for the current pins.
func Path(name string) (string, error) {
	if _, ok := Programs[name]; !ok {
		return "", fmt.Errorf("testdeps: unknown program %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	dir, err := Dir("tools")
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, name), nil
}

// KubeDir returns the directory holding the kube set's programs (the keys
// of KubePrograms), building them first when the cache does not hold the
// build for the current pins. A cold build takes tens of minutes.
func KubeDir() (string, error) {
	return Dir("kube")
}

// S3Path returns the path of versitygw, building the s3 set first when the
// cache does not hold the build for the current pins (about 2 CPU-minutes).
func S3Path() (string, error) {
	dir, err := Dir("s3")
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "versitygw"), nil
}

// Dir returns the directory holding the named set's programs, building the
// set first when the cache does not hold the build for the current pins.
func Dir(setName string) (string, error) {
	s, ok := sets[setName]
	if !ok {
		return "", fmt.Errorf("testdeps: unknown set %q (known: %s)", setName, strings.Join(Sets(), ", "))
	}
	return s.dir()
}

func (s set) dir() (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("testdeps: %w", err)
	}
	return s.dirIn(filepath.Join(root, s.module), filepath.Join(cache, "stoke", "testdeps"))
}

// dirIn returns the directory of s's build from the module in modDir,
// building it into the cache directory cache first if it is not there.
func (s set) dirIn(modDir, cache string) (string, error) {
	pin, err := pinHash(modDir)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(cache, 0o700); err != nil {
		return "", fmt.Errorf("testdeps: %w", err)
	}
	// The directory appears only by the rename below, so existing means whole.
	dir := filepath.Join(cache, s.name+"-"+pin)
	if isDir(dir) {
		return dir, nil
	}
	unlock, err := lock(filepath.Join(cache, s.name+".lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if isDir(dir) { // another process built it while we waited
		return dir, nil
	}
	// Builds that died half-way left their temporary directories; the lock
	// says none is running now.
	stale, _ := filepath.Glob(filepath.Join(cache, s.name+"-*.tmp"))
	for _, d := range stale {
		_ = os.RemoveAll(d)
	}
	tmp, err := os.MkdirTemp(cache, s.name+"-*.tmp")
	if err != nil {
		return "", fmt.Errorf("testdeps: %w", err)
	}
	defer os.RemoveAll(tmp) // a no-op after the rename
	if err := s.build(modDir, tmp); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", fmt.Errorf("testdeps: %w", err)
	}
	return dir, nil
}

// build runs one go build of every program of s into out and gives each
// binary its program name.
func (s set) build(modDir, out string) error {
	args := []string{"build", "-o", out + string(filepath.Separator)}
	if s.ldflags != nil {
		flags, err := s.ldflags(modDir)
		if err != nil {
			return err
		}
		args = append(args, "-ldflags", flags)
	}
	names := make([]string, 0, len(s.programs))
	for n := range s.programs {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		args = append(args, s.programs[n])
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = modDir
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("testdeps: go %s (in %s): %w", strings.Join(args, " "), s.module, err)
	}
	for _, n := range names {
		if built := execName(s.programs[n]); built != n {
			if err := os.Rename(filepath.Join(out, built), filepath.Join(out, n)); err != nil {
				return fmt.Errorf("testdeps: %w", err)
			}
		}
	}
	return nil
}

// execName is the file name go build -o dir/ gives a package's binary: its
// last path element, or the one before a major version suffix v2, v3, ...
// (server/v3 → server), as cmd/go's DefaultExecName does.
func execName(pkg string) string {
	elem := path.Base(pkg)
	if len(elem) >= 2 && elem[0] == 'v' && elem[1] != '0' && elem != "v1" &&
		strings.Trim(elem[1:], "0123456789") == "" {
		elem = path.Base(path.Dir(pkg))
	}
	return elem
}

// kubeLDFlags stamps the Kubernetes version the kube module pins into
// k8s.io/component-base/version, as Kubernetes' own build does, so that
// /version and --version say it (unstamped, they say v0.0.0-master).
func kubeLDFlags(modDir string) (string, error) {
	v, err := moduleVersion(modDir, "k8s.io/kubernetes")
	if err != nil {
		return "", err
	}
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) < 3 {
		return "", fmt.Errorf("testdeps: k8s.io/kubernetes version %q is not vMAJOR.MINOR.PATCH", v)
	}
	const pkg = "k8s.io/component-base/version"
	return fmt.Sprintf("-s -w -X %[1]s.gitVersion=%[2]s -X %[1]s.gitMajor=%[3]s -X %[1]s.gitMinor=%[4]s",
		pkg, v, parts[0], parts[1]), nil
}

// versitygwLDFlags strips the symbol tables (the binary is large and no
// test debugs it) and stamps the pinned version where versitygw's own
// Makefile does, so that its --version says it.
func versitygwLDFlags(modDir string) (string, error) {
	v, err := moduleVersion(modDir, "github.com/versity/versitygw")
	if err != nil {
		return "", err
	}
	return "-s -w -X main.Version=" + v, nil
}

// moduleVersion returns the version of module mod in the build list of the
// module in modDir.
func moduleVersion(modDir, mod string) (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Version}}", mod)
	cmd.Dir = modDir
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("testdeps: go list -m %s: %w", mod, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// ModuleRoot finds Stoke's module root, the directory of its go.mod, from
// the working directory (a test's is its package's directory).
func ModuleRoot() (string, error) {
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

// pinHash names the pins in force: a short hash of a module's go.mod and
// go.sum.
func pinHash(modDir string) (string, error) {
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(modDir, f))
		if err != nil {
			return "", fmt.Errorf("testdeps: %w", err)
		}
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
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
