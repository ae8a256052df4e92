package validation

import (
	"bytes"
	"encoding/base64"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func equalRuns(a, b *v1alpha1.Run) bool { return apiequality.Semantic.DeepEqual(a, b) }

// fullRun sets every field of a Run, spec and status, so that the golden
// file shows the whole wire format.
func fullRun(t *testing.T) *v1alpha1.Run {
	t.Helper()
	// A fixed gzip stream, so that the golden file does not depend on the
	// compressor's output.
	archive, err := base64.StdEncoding.DecodeString("H4sIAAAAAAAA/8rLL1EoSk3MyalUSFQoSSwCBAAA///Ap56iEAAAAA==")
	if err != nil {
		t.Fatal(err)
	}
	start := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	done := metav1.NewTime(time.Date(2026, 1, 2, 3, 5, 0, 0, time.UTC))
	return &v1alpha1.Run{
		TypeMeta: metav1.TypeMeta{APIVersion: "stoke.dev/v1alpha1", Kind: "Run"},
		ObjectMeta: metav1.ObjectMeta{
			Name: "build-42", Namespace: "ci", UID: "6f1c3a52-7d0e-4b8e-9a51-0c7c2b5e9d11",
			ResourceVersion: "17", Labels: map[string]string{"app": "ci"},
			Finalizers: []string{"example.com/cleanup"},
		},
		Spec: v1alpha1.RunSpec{
			Runtime: "bash",
			Mode:    v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Entrypoint: "build.sh", Args: []string{"--target", "linux"}}},
			Source:  &v1alpha1.Source{Archive: &v1alpha1.ArchiveSource{TarGz: archive}},
			Env:     []v1alpha1.EnvVar{{Name: "GOFLAGS", Value: "-mod=mod"}, {Name: "CI", Value: "1"}},
			Timeout: &metav1.Duration{Duration: 10 * time.Minute},
			RetryPolicy: &v1alpha1.RetryPolicy{
				MaxAttempts: 3, Backoff: &metav1.Duration{Duration: 2 * time.Second},
				RetryableReasons: []string{"PodGone", "ExecutionLost"},
			},
			CancelRequested:         true,
			TTLSecondsAfterFinished: ptr(int32(3600)),
		},
		Status: v1alpha1.RunStatus{
			Phase: v1alpha1.PhaseFailed, Reason: "NonZeroExit", Message: "exit status 2",
			AssignedPod: "bash-0", AssignedPodUID: "p-1", Attempt: 2,
			StartTime: &start, CompletionTime: &done, ExitCode: ptr(int32(2)),
			Outputs:  map[string]string{"ARTIFACT": "out/app"},
			Endpoint: "",
			Conditions: []metav1.Condition{{
				Type: "Scheduled", Status: metav1.ConditionTrue, Reason: "Assigned",
				Message: "assigned to bash-0", LastTransitionTime: start,
			}},
		},
	}
}

func fullRuntime() *v1alpha1.Runtime {
	hb := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	return &v1alpha1.Runtime{
		TypeMeta:   metav1.TypeMeta{APIVersion: "stoke.dev/v1alpha1", Kind: "Runtime"},
		ObjectMeta: metav1.ObjectMeta{Name: "python", Namespace: "default", UID: "rt-1"},
		Spec: v1alpha1.RuntimeSpec{
			Server: "python", Replicas: 2, Runs: 16,
			DefaultTaskTimeout:     &metav1.Duration{Duration: 30 * time.Minute},
			DefaultFunctionTimeout: &metav1.Duration{Duration: 24 * time.Hour},
			DefaultInvokeTimeout:   &metav1.Duration{Duration: 30 * time.Second},
			Template:               fullTemplate(),
		},
		Status: v1alpha1.RuntimeStatus{
			ReadyPods: 1,
			Pods: []v1alpha1.PodStatus{
				{Name: "python-0", UID: "p-0", Ready: true, LastHeartbeat: &hb, Address: "127.0.0.1:7070"},
				{Name: "python-1", UID: "p-1"},
			},
			Conditions: []metav1.Condition{{
				Type: "Available", Status: metav1.ConditionFalse, Reason: "PodsStarting",
				LastTransitionTime: hb,
			}},
		},
	}
}

// golden compares got with testdata/name, or rewrites it under -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the encoding (run with -update if the change is intended)\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

func TestRunYAMLRoundTrip(t *testing.T) {
	run := fullRun(t)
	if err := ValidateRun(run); err != nil {
		t.Fatalf("fixture invalid: %v", err)
	}
	out, err := yaml.Marshal(run)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "run.yaml", out)

	var back v1alpha1.Run
	if err := yaml.UnmarshalStrict(out, &back); err != nil {
		t.Fatal(err)
	}
	if !equalRuns(run, &back) {
		t.Errorf("round trip changed the Run:\n%#v\n%#v", run, &back)
	}
}

func TestRuntimeYAMLRoundTrip(t *testing.T) {
	rt := fullRuntime()
	if err := ValidateRuntime(rt); err != nil {
		t.Fatalf("fixture invalid: %v", err)
	}
	out, err := yaml.Marshal(rt)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "runtime.yaml", out)

	var back v1alpha1.Runtime
	if err := yaml.UnmarshalStrict(out, &back); err != nil {
		t.Fatal(err)
	}
	if !apiequality.Semantic.DeepEqual(rt, &back) {
		t.Errorf("round trip changed the Runtime:\n%#v\n%#v", rt, &back)
	}
}

// TestWrittenYAML parses Runs and a Runtime as a user writes them for
// `stoke apply -f` or `kubectl apply -f`, defaults and validates them.
func TestWrittenYAML(t *testing.T) {
	for _, name := range []string{"example-task.yaml", "example-function.yaml"} {
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", name))
			if err != nil {
				t.Fatal(err)
			}
			var run v1alpha1.Run
			if err := yaml.UnmarshalStrict(data, &run); err != nil {
				t.Fatal(err)
			}
			if run.APIVersion != "stoke.dev/v1alpha1" || run.Kind != "Run" {
				t.Fatalf("TypeMeta = %+v", run.TypeMeta)
			}
			SetRunDefaults(&run)
			if err := ValidateRun(&run); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Run("example-runtime.yaml", func(t *testing.T) {
		data, err := os.ReadFile(filepath.Join("testdata", "example-runtime.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var rt v1alpha1.Runtime
		if err := yaml.UnmarshalStrict(data, &rt); err != nil {
			t.Fatal(err)
		}
		SetRuntimeDefaults(&rt)
		if err := ValidateRuntime(&rt); err != nil {
			t.Fatal(err)
		}
	})
}

func TestWrittenYAMLTaskContent(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "example-task.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var run v1alpha1.Run
	if err := yaml.UnmarshalStrict(data, &run); err != nil {
		t.Fatal(err)
	}
	task := run.Spec.Mode.Task
	if task == nil || task.Entrypoint != "hello.sh" || len(task.Args) != 1 || run.Spec.Source.Inline == nil ||
		run.Spec.Timeout.Duration != 5*time.Minute || run.Spec.RetryPolicy.Backoff.Duration != 2*time.Second {
		t.Errorf("parsed %+v", run.Spec)
	}
}

func TestWrittenYAMLRejected(t *testing.T) {
	// A wrong kind parses but does not validate; an unknown field does not
	// parse with the strict decoder every entry point should use.
	var run v1alpha1.Run
	if err := yaml.UnmarshalStrict([]byte("apiVersion: stoke.dev/v1alpha1\nkind: Pod\nmetadata: {name: x}\nspec: {runtime: bash, mode: {task: {args: [true]}}}\n"), &run); err != nil {
		t.Fatal(err)
	}
	SetRunDefaults(&run)
	checkErr(t, ValidateRun(&run), "kind")

	if err := yaml.UnmarshalStrict([]byte("apiVersion: stoke.dev/v1alpha1\nkind: Run\nspec: {runtim: bash}\n"), &v1alpha1.Run{}); err == nil {
		t.Error("unknown field accepted by UnmarshalStrict")
	}
}
