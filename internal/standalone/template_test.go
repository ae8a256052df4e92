package standalone_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
)

// TestRuntimeEnvAndPythonPath gives a python Runtime an env with a
// PYTHONPATH that holds a module no Python has: a function imports it
// and answers, sees the Runtime's other variable, and does not see
// stoke up's own environment; a task sees the Runtime's env beneath its
// Run's own. What standalone cannot do (an image) is refused, naming the
// field, and nothing changes.
func TestRuntimeEnvAndPythonPath(t *testing.T) {
	lib := t.TempDir()
	if err := os.MkdirAll(filepath.Join(lib, "stokeextra"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lib, "stokeextra", "__init__.py"), []byte("VALUE = 'from the Runtime python path'\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// stoke up's own environment, which its pods inherit: no handler may
	// see it.
	t.Setenv("STOKE_TEST_UP_ONLY", "up's secret")
	env := []corev1.EnvVar{{Name: "PYTHONPATH", Value: lib}, {Name: "GREETING", Value: "from the Runtime"}}
	py, sh := runtimeOf("python", 1, 2), runtimeOf("bash", 1, 2)
	py.Spec.Template = &v1alpha1.RuntimeTemplate{Env: env}
	sh.Spec.Template = &v1alpha1.RuntimeTemplate{Env: env}
	p := start(t, py, sh)
	ctx := context.Background()

	created, err := p.CreateRun(ctx, pyFunction("imports", "import os, stokeextra\n"+
		"def handle(event):\n"+
		"    return {'value': stokeextra.VALUE, 'greeting': os.environ.get('GREETING'), 'up': os.environ.get('STOKE_TEST_UP_ONLY')}\n"))
	if err != nil {
		t.Fatal(err)
	}
	ready := p.waitRun(t, "imports", "Ready or ended", phaseIs(v1alpha1.PhaseReady, v1alpha1.PhaseFailed))
	if ready.Status.Phase != v1alpha1.PhaseReady {
		t.Fatalf("the function did not load: %s %s", ready.Status.Reason, ready.Status.Message)
	}
	proxy, err := p.FunctionProxy(ready)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := proxy.InvokeFunction(ctx, &pb.InvokeFunctionRequest{Registration: &pb.FunctionRegistration{RunUid: string(created.UID)}, Input: []byte(`{}`)})
	if err != nil {
		t.Fatalf("invoke: %v", err)
	}
	var got map[string]any
	if err := json.Unmarshal(resp.GetOutput(), &got); err != nil {
		t.Fatalf("%s: %v", resp.GetOutput(), err)
	}
	if got["value"] != "from the Runtime python path" || got["greeting"] != "from the Runtime" || got["up"] != nil {
		t.Fatalf("the function answered %s", resp.GetOutput())
	}

	run := task("env", "bash", "-c", `echo "G=$GREETING" >> "$STOKE_OUTPUTS"; echo "P=$PYTHONPATH" >> "$STOKE_OUTPUTS"; echo "U=${STOKE_TEST_UP_ONLY:-unset}" >> "$STOKE_OUTPUTS"`)
	run.Spec.Env = []v1alpha1.EnvVar{{Name: "GREETING", Value: "from the Run"}}
	if _, err := p.CreateRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	done := p.waitRun(t, "env", "terminal", func(r *v1alpha1.Run) bool { return r.Status.Phase.Terminal() })
	if o := done.Status.Outputs; done.Status.Phase != v1alpha1.PhaseSucceeded || o["G"] != "from the Run" || o["P"] != lib || o["U"] != "unset" {
		t.Fatalf("task %s, outputs %v", done.Status.Phase, o)
	}

	imaged := runtimeOf("python", 1, 2)
	imaged.Spec.Template = &v1alpha1.RuntimeTemplate{Image: "registry.example.com/ml:1", Env: env}
	_, err = p.ApplyRuntime(ctx, imaged)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || errdefs.Code(err) != codes.InvalidArgument ||
		!strings.Contains(err.Error(), "spec.template.image: applies only in Kubernetes mode") {
		t.Fatalf("a template with an image: %v", err)
	}
	stored, err := p.Store().Runtimes().Get(ctx, "default", "python")
	if err != nil || stored.Spec.Template == nil || stored.Spec.Template.Image != "" {
		t.Fatalf("the refused Runtime changed the stored one: %+v %v", stored, err)
	}
}
