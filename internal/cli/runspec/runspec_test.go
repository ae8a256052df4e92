package runspec_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/cli/runspec"
	"stoke.dev/stoke/internal/errdefs"
)

func ptr[T any](v T) *T { return &v }

func TestBuild(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "job.sh")
	if err := os.WriteFile(script, []byte("echo $1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	lookup := func(k string) (string, bool) {
		if k == "HOME_VAR" {
			return "from-here", true
		}
		return "", false
	}
	meta := func(name, generate string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, GenerateName: generate, Namespace: "default"}
	}
	typeMeta := metav1.TypeMeta{APIVersion: "stoke.dev/v1alpha1", Kind: "Run"}
	once := &v1alpha1.RetryPolicy{MaxAttempts: 1}

	for _, tc := range []struct {
		name string
		opts runspec.Options
		want v1alpha1.Run
	}{
		{"args are the argv", runspec.Options{Runtime: "bash", Args: []string{"echo", "hi"}},
			v1alpha1.Run{TypeMeta: typeMeta, ObjectMeta: meta("", "task-"), Spec: v1alpha1.RunSpec{
				Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"echo", "hi"}}}, RetryPolicy: once}}},
		{"a file source is the entrypoint, args its arguments", runspec.Options{Name: "job", Namespace: "ci", Runtime: "bash", Source: script, Args: []string{"world"},
			Env: []string{"A=1", "B=x=y", "HOME_VAR"}, LookupEnv: lookup, Labels: []string{"team=a"},
			Timeout: 30 * time.Second, Retries: 2, TTL: 90 * time.Second},
			v1alpha1.Run{TypeMeta: typeMeta, ObjectMeta: metav1.ObjectMeta{Name: "job", Namespace: "ci", Labels: map[string]string{"team": "a"}}, Spec: v1alpha1.RunSpec{
				Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Entrypoint: "job.sh", Args: []string{"world"}}},
				Source:  &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "job.sh", Text: "echo $1\n"}},
				Env:     []v1alpha1.EnvVar{{Name: "A", Value: "1"}, {Name: "B", Value: "x=y"}, {Name: "HOME_VAR", Value: "from-here"}},
				Timeout: &metav1.Duration{Duration: 30 * time.Second}, RetryPolicy: &v1alpha1.RetryPolicy{MaxAttempts: 3},
				TTLSecondsAfterFinished: ptr(int32(90))}}},
		{"an explicit entrypoint wins over the file", runspec.Options{Runtime: "python", Source: script, Entrypoint: "other.py"},
			v1alpha1.Run{TypeMeta: typeMeta, ObjectMeta: meta("", "task-"), Spec: v1alpha1.RunSpec{
				Runtime: "python", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Entrypoint: "other.py"}},
				Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "job.sh", Text: "echo $1\n"}}, RetryPolicy: once}}},
		{"a function", runspec.Options{Runtime: "python", Handler: "pkg.mod.handle", IdleTimeout: 1500 * time.Millisecond},
			v1alpha1.Run{TypeMeta: typeMeta, ObjectMeta: meta("", "fn-"), Spec: v1alpha1.RunSpec{
				Runtime: "python", Mode: v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "pkg.mod.handle", IdleTimeoutSeconds: 2}}, RetryPolicy: once}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := runspec.Build(tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want.Namespace == "" {
				tc.want.Namespace = "default"
			}
			if !apiequality.Semantic.DeepEqual(got, &tc.want) {
				t.Errorf("Build =\n%+v\nwant\n%+v", got, &tc.want)
			}
		})
	}
}

func TestBuildRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts runspec.Options
		want string
	}{
		{"no runtime", runspec.Options{Args: []string{"true"}}, "--runtime"},
		{"no program", runspec.Options{Runtime: "bash"}, "arguments after --"},
		{"function with args", runspec.Options{Runtime: "bash", Handler: "h.f", Args: []string{"x"}}, "--handler"},
		{"idle timeout on a task", runspec.Options{Runtime: "bash", Args: []string{"x"}, IdleTimeout: time.Second}, "--idle-timeout"},
		{"bad env", runspec.Options{Runtime: "bash", Args: []string{"x"}, Env: []string{"=v"}}, "--env"},
		{"unset env", runspec.Options{Runtime: "bash", Args: []string{"x"}, Env: []string{"NOT_SET_ANYWHERE"}, LookupEnv: func(string) (string, bool) { return "", false }}, "NOT_SET_ANYWHERE"},
		{"env name", runspec.Options{Runtime: "bash", Args: []string{"x"}, Env: []string{"1A=v"}}, "spec.env[0]"},
		{"bad label", runspec.Options{Runtime: "bash", Args: []string{"x"}, Labels: []string{"novalue"}}, "--label"},
		{"retries", runspec.Options{Runtime: "bash", Args: []string{"x"}, Retries: 100}, "--retries"},
		{"negative timeout", runspec.Options{Runtime: "bash", Args: []string{"x"}, Timeout: -time.Second}, "--timeout"},
		{"bad handler", runspec.Options{Runtime: "bash", Handler: "nodot"}, "spec.mode.function.handler"},
		{"bad name", runspec.Options{Runtime: "bash", Args: []string{"x"}, Name: "Not_A_Name"}, "metadata.name"},
		{"missing source", runspec.Options{Runtime: "bash", Args: []string{"x"}, Source: "/does/not/exist"}, "/does/not/exist"},
		{"entrypoint outside", runspec.Options{Runtime: "bash", Entrypoint: "../x.sh"}, "spec.mode.task.entrypoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runspec.Build(tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Build = %v, want an error naming %q", err, tc.want)
			}
			if tc.name != "missing source" && !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("Build = %v, not InvalidArgument", err)
			}
		})
	}
}

func TestBuildFunction(t *testing.T) {
	fn, err := runspec.BuildFunction(runspec.Options{Name: "hello", Runtime: "python", Handler: "main.handler", Scale: "0:8",
		Env: []string{"A=1"}, Labels: []string{"team=x"}, Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	s := fn.Spec
	if s.Scale.Min != 0 || s.Scale.Max != 8 || s.Handler != "main.handler" || s.Runtime != "python" || len(s.Env) != 1 ||
		fn.Labels["team"] != "x" || s.Timeout.Duration != time.Hour || s.Queue.Length == 0 {
		t.Fatalf("%+v", fn)
	}
	for _, tt := range []struct {
		o     runspec.Options
		field string
	}{
		{runspec.Options{Name: "f", Runtime: "python", Handler: "m.h", Scale: "3:2"}, "--scale"},
		{runspec.Options{Name: "f", Runtime: "python", Handler: "m.h", Scale: "8"}, "--scale"},
		{runspec.Options{Name: "f", Runtime: "python", Handler: "m.h", Scale: "-1:2"}, "--scale"},
		{runspec.Options{Name: "f", Runtime: "python", Handler: "m.h", Scale: "0:5000"}, "--scale"},
		{runspec.Options{Runtime: "python", Handler: "m.h", Scale: "0:2"}, "--name"},
		{runspec.Options{Name: "f", Runtime: "python", Scale: "0:2"}, "--scale"},
		{runspec.Options{Name: "f", Runtime: "python", Handler: "m.h", Scale: "0:2", Retries: 2}, "--retries"},
		{runspec.Options{Name: "f.g", Runtime: "python", Handler: "m.h", Scale: "0:2"}, "metadata.name"},
	} {
		_, err := runspec.BuildFunction(tt.o)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("%+v: %v, want InvalidArgument naming %s", tt.o, err, tt.field)
		}
	}
}
