package testdeps

import (
	"os/exec"
	"path/filepath"
	"strings"
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
