package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/kubetest/nodeagent"
)

// userImage is a user's image in the Kubernetes tests: the node agents map
// it to a directory whose Python path holds the module stokeuserlib,
// which Stoke's image lacks, and no Stoke.
const userImage = "registry.example.com/team/python-extra:1"

// userImages makes userImage's files in dir and returns the node agents'
// map of it.
func userImages(t testing.TB, dir string) map[string]nodeagent.Image {
	t.Helper()
	lib := filepath.Join(dir, "site-packages", "stokeuserlib")
	if err := os.MkdirAll(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lib, "__init__.py"), []byte("ANSWER = \"from the user's image\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return map[string]nodeagent.Image{userImage: {
		Root: dir,
		Env:  []string{"PYTHONPATH=" + nodeagent.ImageRoot + "/site-packages"},
	}}
}

const importsUserLib = `import os, stokeuserlib

def handle(event):
    return {"answer": stokeuserlib.ANSWER, "greeting": os.environ.get("GREETING")}
`

// A Runtime whose template runs the runtime-server container in a user's
// image (Stoke's binary copied in by the init container): a Python
// function imports the image's module and answers, with the template's
// env; the same function on the example python Runtime, in Stoke's image,
// cannot import it. A template that would break the Pod is refused by the
// API server with the CRD's message, and nothing is created.
func testUserImage(t *testing.T, e *kubeEnv) {
	ctx := context.Background()
	rt := &v1alpha1.Runtime{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindRuntime},
		ObjectMeta: metav1.ObjectMeta{Namespace: runsNamespace, Name: "python-user"},
		Spec: v1alpha1.RuntimeSpec{Server: "python", Replicas: 1, Runs: 2, Template: &v1alpha1.RuntimeTemplate{
			Image: userImage,
			Env:   []corev1.EnvVar{{Name: "GREETING", Value: "from the template"}},
		}},
	}
	if err := e.stoke.Post().Namespace(runsNamespace).Resource("runtimes").Body(rt).Do(ctx).Error(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.stoke.Delete().Namespace(runsNamespace).Resource("runtimes").Name(rt.Name).Do(context.Background()).Error()
	})
	e.awaitRuntimesReady(t, installBound)

	runs := e.watchRuns(t, "e2e=user-image")
	e.mustCreateRun(t, labelled(newRun("user-lib", noRetry(function("python-user", "fn.handle", "fn.py", importsUserLib))), "user-image"))
	e.mustCreateRun(t, labelled(newRun("stoke-lib", noRetry(function("python", "fn.handle", "fn.py", importsUserLib))), "user-image"))
	got := runs.until(t, runBound, "user-lib Ready and stoke-lib Failed", func(m map[string]*v1alpha1.Run) bool {
		return phaseOf(m, "user-lib") == v1alpha1.PhaseReady && terminal(phaseOf(m, "stoke-lib")) || terminal(phaseOf(m, "user-lib"))
	})
	run := got["user-lib"]
	if run.Status.Phase != v1alpha1.PhaseReady {
		t.Fatalf("user-lib: %s %s", run.Status.Reason, run.Status.Message)
	}
	if fail := got["stoke-lib"]; fail.Status.Phase != v1alpha1.PhaseFailed || !strings.Contains(fail.Status.Message, "stokeuserlib") {
		t.Errorf("stoke-lib, in Stoke's image: %s %s %s, want Failed for want of stokeuserlib", fail.Status.Phase, fail.Status.Reason, fail.Status.Message)
	}
	pod := e.pod(t, runsNamespace, run.Status.AssignedPod)
	if len(pod.Spec.InitContainers) != 1 || pod.Spec.Containers[0].Image != userImage {
		t.Errorf("pod %s: init containers %d, runtime-server image %q", pod.Name, len(pod.Spec.InitContainers), pod.Spec.Containers[0].Image)
	}
	resp, err := invokeHop(e.gatewayConn(t, e.gatewayCredentials(t), run), run, `{}`)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(resp.GetOutput(), &out); err != nil || out["answer"] != "from the user's image" || out["greeting"] != "from the template" {
		t.Errorf("user-lib answered %s (%v)", resp.GetOutput(), err)
	}
	e.deleteRun(t, "user-lib")
	e.deleteRun(t, "stoke-lib")

	// A template that takes the Pod's workspace volume: refused, as
	// kubectl shows it, and no Runtime or Deployment is made.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte(`apiVersion: stoke.dev/v1alpha1
kind: Runtime
metadata: {name: python-bad, namespace: default}
spec:
  server: python
  replicas: 1
  template:
    image: `+userImage+`
    volumes: [{name: workspace, emptyDir: {}}]
    volumeMounts: [{name: workspace, mountPath: /workspace}]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	c := e.cluster
	cmd := exec.Command(filepath.Join(c.BinDir, "kubectl"), "--kubeconfig", c.Kubeconfig, "apply", "-f", bad)
	msg, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("kubectl apply of a template over the workspace: accepted: %s", msg)
	}
	for _, want := range []string{"spec.template.volumes", "are the runtime Pod's own volumes", "spec.template.volumeMounts", "may not be, or be beneath, the runtime Pod's own"} {
		if !strings.Contains(string(msg), want) {
			t.Errorf("kubectl says %q, which does not say %q", msg, want)
		}
	}
	if err := e.stoke.Get().Namespace(runsNamespace).Resource("runtimes").Name("python-bad").Do(ctx).Error(); !apierrors.IsNotFound(err) {
		t.Errorf("the refused Runtime: %v, want NotFound", err)
	}
	if _, err := e.kube.AppsV1().Deployments(runsNamespace).Get(ctx, "python-bad", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the refused Runtime's Deployment: %v, want NotFound", err)
	}
}
