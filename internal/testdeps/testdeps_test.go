package testdeps

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

func TestPathBuildsARunnableProgram(t *testing.T) {
	p, err := Path("aws-lambda-rie")
	if err != nil {
		t.Fatal(err)
	}
	again, err := Path("aws-lambda-rie")
	if err != nil || again != p {
		t.Fatalf("second Path = %q, %v; want %q", again, err, p)
	}
	// The RIE checks its listen address before it does anything else.
	out, err := exec.Command(p, "--runtime-interface-emulator-address", "not-an-address").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not a valid network address") {
		t.Fatalf("%s --help printed %q", p, out)
	}
}

func TestPathRejectsAnUnknownName(t *testing.T) {
	if _, err := Path("no-such-tool"); err == nil || !strings.Contains(err.Error(), "aws-lambda-rie") {
		t.Fatalf("Path(no-such-tool) = %v; want an error listing the known programs", err)
	}
	if _, err := Dir("no-such-set"); err == nil || !strings.Contains(err.Error(), "kube") {
		t.Fatalf("Dir(no-such-set) = %v; want an error listing the known sets", err)
	}
}

// TestKubeDirProgramsReportThePinnedVersions proves the version ldflags
// reach every Kubernetes binary (unstamped, they say v0.0.0-master) and
// that etcd is the pinned one.
func TestKubeDirProgramsReportThePinnedVersions(t *testing.T) {
	dir, err := KubeDir()
	if err != nil {
		t.Fatal(err)
	}
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	modDir := filepath.Join(root, "tools", "kube")
	kube, err := moduleVersion(modDir, "k8s.io/kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	etcd, err := moduleVersion(modDir, "go.etcd.io/etcd/server/v3")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"kube-apiserver", "--version"}, "Kubernetes " + kube + "\n"},
		{[]string{"kube-controller-manager", "--version"}, "Kubernetes " + kube + "\n"},
		{[]string{"kube-scheduler", "--version"}, "Kubernetes " + kube + "\n"},
		{[]string{"kubectl", "version", "--client"}, "Client Version: " + kube + "\n"},
		{[]string{"etcd", "--version"}, "etcd Version: " + strings.TrimPrefix(etcd, "v") + "\n"},
	} {
		out, err := exec.Command(filepath.Join(dir, c.args[0]), c.args[1:]...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%s: %v, printed %q; want it to contain %q", strings.Join(c.args, " "), err, out, c.want)
		}
	}
}

func TestExecName(t *testing.T) {
	for pkg, want := range map[string]string{
		"go.etcd.io/etcd/server/v3":            "server",
		"k8s.io/kubernetes/cmd/kube-apiserver": "kube-apiserver",
		"stoke.dev/stoke/tools/lambdaecho":     "lambdaecho",
		"example.com/v":                        "v",
		"example.com/x/v1":                     "v1",
		"example.com/x/v12":                    "x",
	} {
		if got := execName(pkg); got != want {
			t.Errorf("execName(%q) = %q; want %q", pkg, got, want)
		}
	}
}

// TestSetBuildsOnceWhole builds a set of a module of the test's own from
// two goroutines at once: one go build runs, with the set's ldflags, the
// binary gets its program name (not the package's, here before a major
// version suffix), and no temporary directory is left, a stale one
// included.
func TestSetBuildsOnceWhole(t *testing.T) {
	mod, cache := t.TempDir(), t.TempDir()
	for name, text := range map[string]string{
		"go.mod":  "module example.com/hello/v2\n\ngo 1.26\n",
		"main.go": "package main\n\nimport \"fmt\"\n\nvar greeting = \"unset\"\n\nfunc main() { fmt.Println(greeting) }\n",
		// go.sum may be absent from a module without dependencies, but
		// pinHash reads it.
		"go.sum": "",
	} {
		if err := os.WriteFile(filepath.Join(mod, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(cache, "hello-123.tmp"), 0o700); err != nil {
		t.Fatal(err)
	}
	var builds atomic.Int32
	s := set{name: "hello", programs: map[string]string{"greeter": "example.com/hello/v2"},
		ldflags: func(string) (string, error) { builds.Add(1); return "-X main.greeting=stamped", nil }}
	var wg sync.WaitGroup
	dirs, errs := make([]string, 2), make([]error, 2)
	for i := range dirs {
		wg.Go(func() { dirs[i], errs[i] = s.dirIn(mod, cache) })
	}
	wg.Wait()
	for i := range dirs {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
	}
	if dirs[0] != dirs[1] || builds.Load() != 1 {
		t.Fatalf("dirs %q after %d builds; want one directory from one build", dirs, builds.Load())
	}
	out, err := exec.Command(filepath.Join(dirs[0], "greeter")).Output()
	if err != nil || string(out) != "stamped\n" {
		t.Fatalf("greeter: %q, %v; want the ldflags' greeting", out, err)
	}
	if tmps, _ := filepath.Glob(filepath.Join(cache, "*.tmp")); len(tmps) != 0 {
		t.Errorf("temporary directories left: %q", tmps)
	}
}

// TestS3PathIsThePinnedVersitygw proves the s3 set builds versitygw with
// its version stamped (unstamped, it says "git").
func TestS3PathIsThePinnedVersitygw(t *testing.T) {
	p, err := S3Path()
	if err != nil {
		t.Fatal(err)
	}
	root, err := ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	v, err := moduleVersion(filepath.Join(root, "tools", "s3"), "github.com/versity/versitygw")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(p, "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Version  : "+v+"\n") {
		t.Fatalf("%s --version: %v, printed %q; want version %s", p, err, out, v)
	}
}
