package validation

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

func ptr[T any](v T) *T { return &v }

func gzipBytes(t testing.TB, payload []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(payload); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// gzipOfSize returns n bytes that start with the gzip magic number.
func gzipOfSize(n int) []byte {
	b := make([]byte, n)
	b[0], b[1] = 0x1f, 0x8b
	return b
}

func taskRun() *v1alpha1.Run {
	return &v1alpha1.Run{
		TypeMeta:   metav1.TypeMeta{APIVersion: "stoke.dev/v1alpha1", Kind: "Run"},
		ObjectMeta: metav1.ObjectMeta{Name: "build-1", Namespace: "default", UID: "u-1", Labels: map[string]string{"app": "ci"}},
		Spec: v1alpha1.RunSpec{
			Runtime: "bash",
			Mode:    v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Entrypoint: "build.sh", Args: []string{"--fast"}}},
			Source:  &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "build.sh", Text: "echo hi\n"}},
			Env:     []v1alpha1.EnvVar{{Name: "GOFLAGS", Value: "-mod=mod"}},
			Timeout: &metav1.Duration{Duration: time.Minute},
			RetryPolicy: &v1alpha1.RetryPolicy{
				MaxAttempts: 3, Backoff: &metav1.Duration{Duration: time.Second},
				RetryableReasons: []string{"PodGone"},
			},
			TTLSecondsAfterFinished: ptr(int32(3600)),
		},
	}
}

func functionRun() *v1alpha1.Run {
	r := taskRun()
	r.Name = "fn"
	r.Spec.Mode = v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "handler.handle", IdleTimeoutSeconds: 300}}
	r.Spec.Source = &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "handler.sh", Text: "handle() { echo \"$1\"; }\n"}}
	return r
}

func validRuntime() *v1alpha1.Runtime {
	return &v1alpha1.Runtime{
		TypeMeta:   metav1.TypeMeta{APIVersion: "stoke.dev/v1alpha1", Kind: "Runtime"},
		ObjectMeta: metav1.ObjectMeta{Name: "bash", Namespace: "default", UID: "rt-1"},
		Spec: v1alpha1.RuntimeSpec{
			Server: "bash", Replicas: 2, Runs: 8,
			DefaultTaskTimeout:   &metav1.Duration{Duration: 10 * time.Minute},
			DefaultInvokeTimeout: &metav1.Duration{Duration: 30 * time.Second},
		},
	}
}

// checkErr asserts that err is nil when field is empty, and otherwise that
// it is an InvalidArgument each of whose lines names field.
func checkErr(t *testing.T, err error, field string) {
	t.Helper()
	if field == "" {
		if err != nil {
			t.Fatalf("want valid, got:\n%v", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("want an error naming %s, got nil", field)
	}
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("error is not InvalidArgument: %v", err)
	}
	if got := errdefs.Code(err); got != codes.InvalidArgument {
		t.Errorf("gRPC code %v, want InvalidArgument", got)
	}
	for _, line := range strings.Split(err.Error(), "\n") {
		if !strings.HasPrefix(line, field+": ") {
			t.Errorf("want every problem to name %s, got %q", field, bounds.Truncate(line, 300))
		}
	}
}

// The case tables below say what internal/validation accepts; the CRD test
// (crd_kube_test.go) holds the API server, with the generated CRDs, to the
// same answers.

// runCase is one Run to create.
type runCase struct {
	name   string
	base   func() *v1alpha1.Run
	mutate func(*v1alpha1.Run)
	field  string // "" means valid
}

func runCases(t testing.TB) []runCase {
	return []runCase{
		{"task", taskRun, func(*v1alpha1.Run) {}, ""},
		{"function", functionRun, func(*v1alpha1.Run) {}, ""},
		{"no TypeMeta", taskRun, func(r *v1alpha1.Run) { r.TypeMeta = metav1.TypeMeta{} }, ""},
		{"wrong apiVersion", taskRun, func(r *v1alpha1.Run) { r.APIVersion = "stoke.dev/v1" }, "apiVersion"},
		{"wrong kind", taskRun, func(r *v1alpha1.Run) { r.Kind = "Runtime" }, "kind"},

		// metadata
		{"name empty", taskRun, func(r *v1alpha1.Run) { r.Name = "" }, "metadata.name"},
		{"name 253", taskRun, func(r *v1alpha1.Run) { r.Name = strings.Repeat("a", 253) }, ""},
		{"name 254", taskRun, func(r *v1alpha1.Run) { r.Name = strings.Repeat("a", 254) }, "metadata.name"},
		{"name subdomain", taskRun, func(r *v1alpha1.Run) { r.Name = "build.v2" }, ""},
		{"name upper case", taskRun, func(r *v1alpha1.Run) { r.Name = "Build" }, "metadata.name"},
		{"name underscore", taskRun, func(r *v1alpha1.Run) { r.Name = "a_b" }, "metadata.name"},
		{"namespace empty", taskRun, func(r *v1alpha1.Run) { r.Namespace = "" }, "metadata.namespace"},
		{"namespace 63", taskRun, func(r *v1alpha1.Run) { r.Namespace = strings.Repeat("n", 63) }, ""},
		{"namespace 64", taskRun, func(r *v1alpha1.Run) { r.Namespace = strings.Repeat("n", 64) }, "metadata.namespace"},
		{"namespace with dot", taskRun, func(r *v1alpha1.Run) { r.Namespace = "a.b" }, "metadata.namespace"},
		{"label key", taskRun, func(r *v1alpha1.Run) { r.Labels = map[string]string{"bad key": "v"} }, "metadata.labels"},
		{"label value 63", taskRun, func(r *v1alpha1.Run) { r.Labels = map[string]string{"k": strings.Repeat("v", 63)} }, ""},
		{"label value 64", taskRun, func(r *v1alpha1.Run) { r.Labels = map[string]string{"k": strings.Repeat("v", 64)} }, "metadata.labels"},
		{"annotation key", taskRun, func(r *v1alpha1.Run) { r.Annotations = map[string]string{"bad key": "v"} }, "metadata.annotations"},
		{"finalizer", taskRun, func(r *v1alpha1.Run) { r.Finalizers = []string{"example.com/cleanup"} }, ""},
		{"Stoke's finalizer", taskRun, func(r *v1alpha1.Run) { r.Finalizers = []string{"example.com/a", v1alpha1.FinalizerRuntimed} }, "metadata.finalizers[1]"},
		{"bad finalizer", taskRun, func(r *v1alpha1.Run) { r.Finalizers = []string{"not a finalizer"} }, "metadata.finalizers"},

		// spec.runtime
		{"runtime empty", taskRun, func(r *v1alpha1.Run) { r.Spec.Runtime = "" }, "spec.runtime"},
		{"runtime 63", taskRun, func(r *v1alpha1.Run) { r.Spec.Runtime = strings.Repeat("r", 63) }, ""},
		{"runtime 64", taskRun, func(r *v1alpha1.Run) { r.Spec.Runtime = strings.Repeat("r", 64) }, "spec.runtime"},
		{"runtime with dot", taskRun, func(r *v1alpha1.Run) { r.Spec.Runtime = "a.b" }, "spec.runtime"},

		// spec.mode
		{"no mode", taskRun, func(r *v1alpha1.Run) { r.Spec.Mode = v1alpha1.RunMode{} }, "spec.mode"},
		{"both modes", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Mode.Function = &v1alpha1.FunctionMode{Handler: "h.f"}
		}, "spec.mode"},

		// task
		{"task empty", taskRun, func(r *v1alpha1.Run) { r.Spec.Mode.Task = &v1alpha1.TaskMode{} }, "spec.mode.task"},
		{"tty size", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Mode.Task.TTY, r.Spec.Mode.Task.TTYSize = true, &v1alpha1.TerminalSize{Width: 111, Height: 33}
		}, ""},
		{"tty size without tty", taskRun, func(r *v1alpha1.Run) { r.Spec.Mode.Task.TTYSize = &v1alpha1.TerminalSize{Width: 111, Height: 33} }, "spec.mode.task.ttySize"},
		{"tty size zero", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Mode.Task.TTY, r.Spec.Mode.Task.TTYSize = true, &v1alpha1.TerminalSize{Width: 0, Height: 33}
		}, "spec.mode.task.ttySize.width"},
		{"tty size 65536", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Mode.Task.TTY, r.Spec.Mode.Task.TTYSize = true, &v1alpha1.TerminalSize{Width: 80, Height: 65536}
		}, "spec.mode.task.ttySize.height"},
		{"held", taskRun, func(r *v1alpha1.Run) { r.Spec.Held = true }, ""},
		{"task entrypoint only", taskRun, func(r *v1alpha1.Run) { r.Spec.Mode.Task.Args = nil }, ""},
		{"task args only", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Mode.Task = &v1alpha1.TaskMode{Args: []string{"echo", "hi"}}
		}, ""},
		{"entrypoint in dir", taskRun, func(r *v1alpha1.Run) { r.Spec.Mode.Task.Entrypoint = "./scripts/build.sh" }, ""},
		{"entrypoint absolute", taskRun, func(r *v1alpha1.Run) { r.Spec.Mode.Task.Entrypoint = "/bin/sh" }, "spec.mode.task.entrypoint"},
		{"entrypoint ..", taskRun, func(r *v1alpha1.Run) { r.Spec.Mode.Task.Entrypoint = "../x.sh" }, "spec.mode.task.entrypoint"},
		{"entrypoint inner ..", taskRun, func(r *v1alpha1.Run) { r.Spec.Mode.Task.Entrypoint = "a/../../x.sh" }, "spec.mode.task.entrypoint"},
		{"entrypoint dot", taskRun, func(r *v1alpha1.Run) { r.Spec.Mode.Task.Entrypoint = "." }, "spec.mode.task.entrypoint"},
		{"entrypoint dir", taskRun, func(r *v1alpha1.Run) { r.Spec.Mode.Task.Entrypoint = "scripts/" }, "spec.mode.task.entrypoint"},
		{"entrypoint NUL", taskRun, func(r *v1alpha1.Run) { r.Spec.Mode.Task.Entrypoint = "a\x00b" }, "spec.mode.task.entrypoint"},
		{"entrypoint at bound", taskRun, func(r *v1alpha1.Run) { r.Spec.Mode.Task.Entrypoint = strings.Repeat("e", bounds.Path) }, ""},
		{"entrypoint past bound", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Mode.Task.Entrypoint = strings.Repeat("e", bounds.Path+1)
		}, "spec.mode.task.entrypoint"},
		{"args at bound", taskRun, func(r *v1alpha1.Run) { r.Spec.Mode.Task.Args = make([]string, bounds.Args) }, ""},
		{"args past bound", taskRun, func(r *v1alpha1.Run) { r.Spec.Mode.Task.Args = make([]string, bounds.Args+1) }, "spec.mode.task.args"},
		{"arg at bound", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Mode.Task.Args = []string{"a", "b", "c", strings.Repeat("x", bounds.Arg)}
		}, ""},
		{"arg past bound", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Mode.Task.Args = []string{"a", "b", "c", strings.Repeat("x", bounds.Arg+1)}
		}, "spec.mode.task.args[3]"},
		{"arg NUL", taskRun, func(r *v1alpha1.Run) { r.Spec.Mode.Task.Args = []string{"a\x00"} }, "spec.mode.task.args[0]"},

		// function
		{"handler empty", functionRun, func(r *v1alpha1.Run) { r.Spec.Mode.Function.Handler = "" }, "spec.mode.function.handler"},
		{"handler at bound", functionRun, func(r *v1alpha1.Run) {
			r.Spec.Mode.Function.Handler = strings.Repeat("h", bounds.Handler-2) + ".f"
		}, ""},
		{"handler past bound", functionRun, func(r *v1alpha1.Run) {
			r.Spec.Mode.Function.Handler = strings.Repeat("h", bounds.Handler-1) + ".f"
		}, "spec.mode.function.handler"},
		{"handler bash in dir", functionRun, func(r *v1alpha1.Run) { r.Spec.Mode.Function.Handler = "fns/handler.handle" }, ""},
		{"handler python dotted", functionRun, func(r *v1alpha1.Run) { r.Spec.Mode.Function.Handler = "pkg.mod.handle_2" }, ""},
		{"handler no dot", functionRun, func(r *v1alpha1.Run) { r.Spec.Mode.Function.Handler = "handle" }, "spec.mode.function.handler"},
		{"handler absolute", functionRun, func(r *v1alpha1.Run) { r.Spec.Mode.Function.Handler = "/etc/x.f" }, "spec.mode.function.handler"},
		{"handler ..", functionRun, func(r *v1alpha1.Run) { r.Spec.Mode.Function.Handler = "../x.f" }, "spec.mode.function.handler"},
		{"handler inner ..", functionRun, func(r *v1alpha1.Run) { r.Spec.Mode.Function.Handler = "a/../x.f" }, "spec.mode.function.handler"},
		{"handler empty file", functionRun, func(r *v1alpha1.Run) { r.Spec.Mode.Function.Handler = ".f" }, "spec.mode.function.handler"},
		{"handler dir only", functionRun, func(r *v1alpha1.Run) { r.Spec.Mode.Function.Handler = "dir/.f" }, "spec.mode.function.handler"},
		{"handler empty function", functionRun, func(r *v1alpha1.Run) { r.Spec.Mode.Function.Handler = "x." }, "spec.mode.function.handler"},
		{"handler function digit", functionRun, func(r *v1alpha1.Run) { r.Spec.Mode.Function.Handler = "x.1f" }, "spec.mode.function.handler"},
		{"handler function dash", functionRun, func(r *v1alpha1.Run) { r.Spec.Mode.Function.Handler = "x.f-g" }, "spec.mode.function.handler"},
		{"handler function slash", functionRun, func(r *v1alpha1.Run) { r.Spec.Mode.Function.Handler = "x.y/f" }, "spec.mode.function.handler"},
		{"idle timeout 0", functionRun, func(r *v1alpha1.Run) { r.Spec.Mode.Function.IdleTimeoutSeconds = 0 }, ""},
		{"idle timeout negative", functionRun, func(r *v1alpha1.Run) { r.Spec.Mode.Function.IdleTimeoutSeconds = -1 }, "spec.mode.function.idleTimeoutSeconds"},

		// source
		{"no source", taskRun, func(r *v1alpha1.Run) { r.Spec.Source = nil }, ""},
		{"empty source", taskRun, func(r *v1alpha1.Run) { r.Spec.Source = &v1alpha1.Source{} }, ""},
		{"inline and archive", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Source.Archive = &v1alpha1.ArchiveSource{TarGz: gzipOfSize(16)}
		}, "spec.source"},
		{"inline path empty", taskRun, func(r *v1alpha1.Run) { r.Spec.Source.Inline.Path = "" }, "spec.source.inline.path"},
		{"inline path absolute", taskRun, func(r *v1alpha1.Run) { r.Spec.Source.Inline.Path = "/tmp/x" }, "spec.source.inline.path"},
		{"inline path ..", taskRun, func(r *v1alpha1.Run) { r.Spec.Source.Inline.Path = "a/../../x" }, "spec.source.inline.path"},
		{"inline path dot", taskRun, func(r *v1alpha1.Run) { r.Spec.Source.Inline.Path = "." }, "spec.source.inline.path"},
		{"inline path dot slash", taskRun, func(r *v1alpha1.Run) { r.Spec.Source.Inline.Path = "./" }, "spec.source.inline.path"},
		{"inline path dir slash", taskRun, func(r *v1alpha1.Run) { r.Spec.Source.Inline.Path = "lib/" }, "spec.source.inline.path"},
		{"inline path dir dot", taskRun, func(r *v1alpha1.Run) { r.Spec.Source.Inline.Path = "lib/." }, "spec.source.inline.path"},
		{"inline path from dot", taskRun, func(r *v1alpha1.Run) { r.Spec.Source.Inline.Path = "./lib/.x" }, ""},
		{"inline path past bound", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Source.Inline.Path = strings.Repeat("p", bounds.Path+1)
		}, "spec.source.inline.path"},
		{"inline text multibyte past bound", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Source.Inline.Text = strings.Repeat("é", bounds.Source/2+1) // fewer characters than bytes
		}, "spec.source.inline.text"},
		{"inline text at bound", taskRun, func(r *v1alpha1.Run) { r.Spec.Source.Inline.Text = strings.Repeat("x", bounds.InvokeBody) }, ""},
		{"inline text past bound", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Source.Inline.Text = strings.Repeat("x", bounds.InvokeBody+1)
		}, "spec.source.inline.text"},
		{"archive real", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Source = &v1alpha1.Source{Archive: &v1alpha1.ArchiveSource{TarGz: gzipBytes(t, []byte("tar"))}}
		}, ""},
		{"archive at bound", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Source = &v1alpha1.Source{Archive: &v1alpha1.ArchiveSource{TarGz: gzipOfSize(bounds.InvokeBody)}}
		}, ""},
		{"archive past bound", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Source = &v1alpha1.Source{Archive: &v1alpha1.ArchiveSource{TarGz: gzipOfSize(bounds.InvokeBody + 1)}}
		}, "spec.source.archive.tarGz"},
		{"archive empty", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Source = &v1alpha1.Source{Archive: &v1alpha1.ArchiveSource{}}
		}, "spec.source.archive.tarGz"},
		{"archive not gzip", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Source = &v1alpha1.Source{Archive: &v1alpha1.ArchiveSource{TarGz: []byte("PK\x03\x04")}}
		}, "spec.source.archive.tarGz"},

		// source.git
		{"git commit", taskRun, func(r *v1alpha1.Run) { r.Spec.Source.Git = gitSource() }, ""},
		{"git ref and path", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Source.Git = &v1alpha1.GitSource{URL: "https://example.com/a/b.git", Ref: "refs/tags/v1.2", Path: "src/b"}
		}, ""},
		{"git only", taskRun, func(r *v1alpha1.Run) { r.Spec.Source = &v1alpha1.Source{Git: gitSource()} }, ""},
		{"git secret", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Source.Git = gitSource()
			r.Spec.Source.Git.CredentialsSecret = "git-creds"
		}, ""},
		{"git commit and ref", taskRun, func(r *v1alpha1.Run) { r.Spec.Source.Git = gitSource(); r.Spec.Source.Git.Ref = "main" }, "spec.source.git"},
		{"git neither", taskRun, func(r *v1alpha1.Run) { r.Spec.Source.Git = gitSource(); r.Spec.Source.Git.Commit = "" }, "spec.source.git"},
		{"git short commit", taskRun, func(r *v1alpha1.Run) { r.Spec.Source.Git = gitSource(); r.Spec.Source.Git.Commit = "abc123" }, "spec.source.git.commit"},
		{"git file URL", taskRun, func(r *v1alpha1.Run) { r.Spec.Source.Git = gitSource(); r.Spec.Source.Git.URL = "file:///etc" }, "spec.source.git.url"},
		{"git ext URL", taskRun, func(r *v1alpha1.Run) { r.Spec.Source.Git = gitSource(); r.Spec.Source.Git.URL = "ext::sh -c x" }, "spec.source.git.url"},
		{"git URL credentials", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Source.Git = gitSource()
			r.Spec.Source.Git.URL = "https://user:pw@example.com/r.git"
		}, "spec.source.git.url"},
		{"git ref option", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Source.Git = &v1alpha1.GitSource{URL: "git://127.0.0.1/r", Ref: "--upload-pack=x"}
		}, "spec.source.git.ref"},
		{"git ref ..", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Source.Git = &v1alpha1.GitSource{URL: "git://127.0.0.1/r", Ref: "main..x"}
		}, "spec.source.git.ref"},
		{"git ref colon", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Source.Git = &v1alpha1.GitSource{URL: "git://127.0.0.1/r", Ref: "a:b"}
		}, "spec.source.git.ref"},
		{"git path ..", taskRun, func(r *v1alpha1.Run) { r.Spec.Source.Git = gitSource(); r.Spec.Source.Git.Path = "a/../../x" }, "spec.source.git.path"},
		{"git path absolute", taskRun, func(r *v1alpha1.Run) { r.Spec.Source.Git = gitSource(); r.Spec.Source.Git.Path = "/tmp" }, "spec.source.git.path"},
		{"git secret name", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Source.Git = gitSource()
			r.Spec.Source.Git.CredentialsSecret = "Bad_Name"
		}, "spec.source.git.credentialsSecret"},

		// placement
		{"placement", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Placement = &v1alpha1.Placement{PodUID: "6f1c2a9e-1b7d-4c55-9a0e-3d2f8b7c6a51", Workspace: "wf-1.build", ReleaseWorkspace: true}
		}, ""},
		{"placement pod only", taskRun, func(r *v1alpha1.Run) { r.Spec.Placement = &v1alpha1.Placement{PodUID: "p-1"} }, ""},
		{"workspace ..", taskRun, func(r *v1alpha1.Run) { r.Spec.Placement = &v1alpha1.Placement{Workspace: ".."} }, "spec.placement.workspace"},
		{"workspace slash", taskRun, func(r *v1alpha1.Run) { r.Spec.Placement = &v1alpha1.Placement{Workspace: "a/b"} }, "spec.placement.workspace"},
		{"workspace past bound", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Placement = &v1alpha1.Placement{Workspace: strings.Repeat("w", bounds.PlacementName+1)}
		}, "spec.placement.workspace"},
		{"pod UID slash", taskRun, func(r *v1alpha1.Run) { r.Spec.Placement = &v1alpha1.Placement{PodUID: "../p"} }, "spec.placement.podUID"},
		{"release without workspace", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Placement = &v1alpha1.Placement{PodUID: "p-1", ReleaseWorkspace: true}
		}, "spec.placement.releaseWorkspace"},

		// env
		{"env at bound", taskRun, func(r *v1alpha1.Run) { r.Spec.Env = envOf(bounds.EnvEntries) }, ""},
		{"env past bound", taskRun, func(r *v1alpha1.Run) { r.Spec.Env = envOf(bounds.EnvEntries + 1) }, "spec.env"},
		{"env lower and underscore", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Env = []v1alpha1.EnvVar{{Name: "_x1", Value: ""}, {Name: "Path", Value: "a=b"}}
		}, ""},
		{"env name empty", taskRun, func(r *v1alpha1.Run) { r.Spec.Env = []v1alpha1.EnvVar{{Name: ""}} }, "spec.env[0].name"},
		{"env name digit", taskRun, func(r *v1alpha1.Run) { r.Spec.Env = []v1alpha1.EnvVar{{Name: "1X"}} }, "spec.env[0]"},
		{"env name with =", taskRun, func(r *v1alpha1.Run) { r.Spec.Env = []v1alpha1.EnvVar{{Name: "A=B"}} }, "spec.env[0]"},
		{"env name duplicate", taskRun, func(r *v1alpha1.Run) {
			r.Spec.Env = []v1alpha1.EnvVar{{Name: "A"}, {Name: "B"}, {Name: "A"}}
		}, "spec.env[2].name"},
		{"env value NUL", taskRun, func(r *v1alpha1.Run) { r.Spec.Env = []v1alpha1.EnvVar{{Name: "A", Value: "a\x00"}} }, "spec.env[0]"},

		// timeout
		{"timeout nil", taskRun, func(r *v1alpha1.Run) { r.Spec.Timeout = nil }, ""},
		{"timeout 0", taskRun, func(r *v1alpha1.Run) { r.Spec.Timeout = &metav1.Duration{} }, ""},
		{"timeout negative", taskRun, func(r *v1alpha1.Run) { r.Spec.Timeout = &metav1.Duration{Duration: -1} }, "spec.timeout"},

		// retryPolicy
		{"no retry policy", taskRun, func(r *v1alpha1.Run) { r.Spec.RetryPolicy = nil }, ""},
		{"maxAttempts 0", taskRun, func(r *v1alpha1.Run) { r.Spec.RetryPolicy.MaxAttempts = 0 }, ""},
		{"maxAttempts 1", taskRun, func(r *v1alpha1.Run) { r.Spec.RetryPolicy.MaxAttempts = 1 }, ""},
		{"maxAttempts 100", taskRun, func(r *v1alpha1.Run) { r.Spec.RetryPolicy.MaxAttempts = 100 }, ""},
		{"maxAttempts 101", taskRun, func(r *v1alpha1.Run) { r.Spec.RetryPolicy.MaxAttempts = 101 }, "spec.retryPolicy.maxAttempts"},
		{"maxAttempts -1", taskRun, func(r *v1alpha1.Run) { r.Spec.RetryPolicy.MaxAttempts = -1 }, "spec.retryPolicy.maxAttempts"},
		{"backoff 0", taskRun, func(r *v1alpha1.Run) { r.Spec.RetryPolicy.Backoff = &metav1.Duration{} }, ""},
		{"backoff negative", taskRun, func(r *v1alpha1.Run) {
			r.Spec.RetryPolicy.Backoff = &metav1.Duration{Duration: -time.Second}
		}, "spec.retryPolicy.backoff"},
		{"reasons", taskRun, func(r *v1alpha1.Run) {
			r.Spec.RetryPolicy.RetryableReasons = []string{"PodGone", "NonZeroExit", "Timeout"}
		}, ""},
		{"reason empty", taskRun, func(r *v1alpha1.Run) {
			r.Spec.RetryPolicy.RetryableReasons = []string{"PodGone", ""}
		}, "spec.retryPolicy.retryableReasons[1]"},
		{"reason syntax", taskRun, func(r *v1alpha1.Run) {
			r.Spec.RetryPolicy.RetryableReasons = []string{"pod gone"}
		}, "spec.retryPolicy.retryableReasons[0]"},
		{"reason at bound", taskRun, func(r *v1alpha1.Run) {
			r.Spec.RetryPolicy.RetryableReasons = []string{strings.Repeat("R", 1024)}
		}, ""},
		{"reason past bound", taskRun, func(r *v1alpha1.Run) {
			r.Spec.RetryPolicy.RetryableReasons = []string{strings.Repeat("R", 1025)}
		}, "spec.retryPolicy.retryableReasons[0]"},

		// ttl
		{"ttl 0", taskRun, func(r *v1alpha1.Run) { r.Spec.TTLSecondsAfterFinished = ptr(int32(0)) }, ""},
		{"ttl negative", taskRun, func(r *v1alpha1.Run) { r.Spec.TTLSecondsAfterFinished = ptr(int32(-1)) }, "spec.ttlSecondsAfterFinished"},
	}
}

func gitSource() *v1alpha1.GitSource {
	return &v1alpha1.GitSource{URL: "git://127.0.0.1:9418/repo.git", Commit: strings.Repeat("0123456789", 4)}
}

func TestValidateRun(t *testing.T) {
	for _, tt := range runCases(t) {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.base()
			tt.mutate(r)
			checkErr(t, ValidateRun(r), tt.field)
		})
	}
}

func envOf(n int) []v1alpha1.EnvVar {
	env := make([]v1alpha1.EnvVar, n)
	for i := range env {
		env[i] = v1alpha1.EnvVar{Name: fmt.Sprintf("V%d", i), Value: "x"}
	}
	return env
}

func TestValidateRunCollectsAll(t *testing.T) {
	r := taskRun()
	r.Name = ""
	r.Spec.Runtime = ""
	r.Spec.Timeout = &metav1.Duration{Duration: -1}
	err := ValidateRun(r)
	if err == nil {
		t.Fatal("want errors")
	}
	for _, f := range []string{"metadata.name: ", "spec.runtime: ", "spec.timeout: "} {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error does not name %s:\n%v", f, err)
		}
	}
	if got := len(strings.Split(err.Error(), "\n")); got != 3 {
		t.Errorf("got %d problems, want 3:\n%v", got, err)
	}
}

func TestValidateRunCapsErrors(t *testing.T) {
	r := taskRun()
	r.Spec.Mode.Task.Args = make([]string, bounds.Args)
	for i := range r.Spec.Mode.Task.Args {
		r.Spec.Mode.Task.Args[i] = "\x00"
	}
	err := ValidateRun(r)
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != MaxErrors+1 {
		t.Fatalf("got %d lines, want %d", len(lines), MaxErrors+1)
	}
	if want := fmt.Sprintf("and %d more problems", bounds.Args-MaxErrors); lines[MaxErrors] != want {
		t.Errorf("last line %q, want %q", lines[MaxErrors], want)
	}
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Error("not InvalidArgument")
	}
}

func TestValidateRunQuotesBriefly(t *testing.T) {
	huge := strings.Repeat("X", 64<<10)
	for _, tt := range []struct {
		name   string
		mutate func(*v1alpha1.Run)
	}{
		{"runtime", func(r *v1alpha1.Run) { r.Spec.Runtime = huge }},
		// apimachinery's label and annotation checks repeat a value whole.
		{"label value", func(r *v1alpha1.Run) { r.Labels = map[string]string{"a": huge} }},
		{"nineteen label values", func(r *v1alpha1.Run) {
			r.Labels = map[string]string{}
			for i := range 19 {
				r.Labels[fmt.Sprint("k", i)] = huge
			}
		}},
		{"label key", func(r *v1alpha1.Run) { r.Labels = map[string]string{huge: "v"} }},
		{"annotation key", func(r *v1alpha1.Run) { r.Annotations = map[string]string{huge: "v"} }},
		{"finalizer", func(r *v1alpha1.Run) { r.Finalizers = []string{huge} }},
		{"env key", func(r *v1alpha1.Run) { r.Spec.Env = []v1alpha1.EnvVar{{Name: huge + "-"}} }},
		{"source path", func(r *v1alpha1.Run) { r.Spec.Source.Inline.Path = "/" + huge[:bounds.Path-1] }},
		{"retryable reason", func(r *v1alpha1.Run) { r.Spec.RetryPolicy.RetryableReasons = []string{huge[:1000] + "-"} }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := taskRun()
			tt.mutate(r)
			err := ValidateRun(r)
			if err == nil {
				t.Fatal("valid")
			}
			// Each problem repeats at most bounds.Quoted bytes of a value.
			for _, line := range strings.Split(err.Error(), "\n") {
				if len(line) > 600 {
					t.Errorf("a problem of %d bytes: %.300s", len(line), line)
				}
			}
		})
	}
}

func TestValidateRunNil(t *testing.T) {
	checkErr(t, ValidateRun(nil), "run")
	checkErr(t, ValidateRunUpdate(nil, taskRun()), "run")
	checkErr(t, ValidateRuntime(nil), "runtime")
	checkErr(t, ValidateRuntimeUpdate(validRuntime(), nil), "runtime")
}

// runUpdateCase is an update of a taskRun: old changes the stored Run
// (nil: none), mutate makes the update from it.
type runUpdateCase struct {
	name   string
	old    func(*v1alpha1.Run)
	mutate func(*v1alpha1.Run)
	field  string
}

var runUpdateCases = []runUpdateCase{
	{"unchanged", nil, func(*v1alpha1.Run) {}, ""},
	{"cancel", nil, func(r *v1alpha1.Run) { r.Spec.CancelRequested = true }, ""},
	{"cancel again", func(r *v1alpha1.Run) { r.Spec.CancelRequested = true }, func(r *v1alpha1.Run) { r.Spec.CancelRequested = true }, ""},
	{"uncancel", func(r *v1alpha1.Run) { r.Spec.CancelRequested = true }, func(r *v1alpha1.Run) { r.Spec.CancelRequested = false }, "spec.cancelRequested"},
	{"release", func(r *v1alpha1.Run) { r.Spec.Held = true }, func(r *v1alpha1.Run) { r.Spec.Held = false }, ""},
	{"held still", func(r *v1alpha1.Run) { r.Spec.Held = true }, func(r *v1alpha1.Run) { r.Spec.Held = true }, ""},
	{"hold", nil, func(r *v1alpha1.Run) { r.Spec.Held = true }, "spec.held"},
	{"ttl changed", nil, func(r *v1alpha1.Run) { r.Spec.TTLSecondsAfterFinished = ptr(int32(60)) }, ""},
	{"ttl removed", nil, func(r *v1alpha1.Run) { r.Spec.TTLSecondsAfterFinished = nil }, ""},
	{"ttl negative", nil, func(r *v1alpha1.Run) { r.Spec.TTLSecondsAfterFinished = ptr(int32(-1)) }, "spec.ttlSecondsAfterFinished"},
	{"labels changed", nil, func(r *v1alpha1.Run) { r.Labels = map[string]string{"app": "other"} }, ""},
	{"labels invalid", nil, func(r *v1alpha1.Run) { r.Labels = map[string]string{"bad key": ""} }, "metadata.labels"},
	{"status changed", nil, func(r *v1alpha1.Run) { r.Status.Phase = v1alpha1.PhaseRunning }, ""},
	{"nil env vs empty", nil, func(r *v1alpha1.Run) { r.Spec.Env = nil }, "spec.env"},
	{"empty env vs nil", func(r *v1alpha1.Run) { r.Spec.Env = nil }, func(r *v1alpha1.Run) { r.Spec.Env = []v1alpha1.EnvVar{} }, ""},
	{"name", nil, func(r *v1alpha1.Run) { r.Name = "other" }, "metadata.name"},
	{"namespace", nil, func(r *v1alpha1.Run) { r.Namespace = "other" }, "metadata.namespace"},
	{"uid", nil, func(r *v1alpha1.Run) { r.UID = types.UID("u-2") }, "metadata.uid"},
	{"runtime", nil, func(r *v1alpha1.Run) { r.Spec.Runtime = "python" }, "spec.runtime"},
	{"args", nil, func(r *v1alpha1.Run) { r.Spec.Mode.Task.Args = append(r.Spec.Mode.Task.Args, "x") }, "spec.mode"},
	{"source", nil, func(r *v1alpha1.Run) { r.Spec.Source.Inline.Text = "echo changed" }, "spec.source"},
	{"env", nil, func(r *v1alpha1.Run) { r.Spec.Env[0].Value = "x" }, "spec.env"},
	{"timeout", nil, func(r *v1alpha1.Run) { r.Spec.Timeout.Duration = time.Hour }, "spec.timeout"},
	{"retry policy", nil, func(r *v1alpha1.Run) { r.Spec.RetryPolicy.MaxAttempts = 5 }, "spec.retryPolicy"},
}

func TestValidateRunUpdate(t *testing.T) {
	for _, tt := range runUpdateCases {
		t.Run(tt.name, func(t *testing.T) {
			old := taskRun()
			if tt.old != nil {
				tt.old(old)
			}
			nw := old.DeepCopy()
			tt.mutate(nw)
			checkErr(t, ValidateRunUpdate(old, nw), tt.field)
		})
	}
}

// runtimeCase changes a validRuntime, for a create or an update of it.
type runtimeCase struct {
	name   string
	mutate func(*v1alpha1.Runtime)
	field  string
}

var runtimeCases = []runtimeCase{
	{"valid", func(*v1alpha1.Runtime) {}, ""},
	{"python", func(rt *v1alpha1.Runtime) { rt.Spec.Server = "python" }, ""},
	{"wrong kind", func(rt *v1alpha1.Runtime) { rt.Kind = "Run" }, "kind"},
	{"name empty", func(rt *v1alpha1.Runtime) { rt.Name = "" }, "metadata.name"},
	{"name 63", func(rt *v1alpha1.Runtime) { rt.Name = strings.Repeat("a", 63) }, ""},
	{"name 64", func(rt *v1alpha1.Runtime) { rt.Name = strings.Repeat("a", 64) }, "metadata.name"},
	{"name with dot", func(rt *v1alpha1.Runtime) { rt.Name = "a.b" }, "metadata.name"},
	{"namespace empty", func(rt *v1alpha1.Runtime) { rt.Namespace = "" }, "metadata.namespace"},
	{"server empty", func(rt *v1alpha1.Runtime) { rt.Spec.Server = "" }, "spec.server"},
	{"server unknown", func(rt *v1alpha1.Runtime) { rt.Spec.Server = "node" }, "spec.server"},
	{"replicas 0", func(rt *v1alpha1.Runtime) { rt.Spec.Replicas = 0 }, ""},
	{"replicas 64", func(rt *v1alpha1.Runtime) { rt.Spec.Replicas = 64 }, ""},
	{"replicas 65", func(rt *v1alpha1.Runtime) { rt.Spec.Replicas = 65 }, "spec.replicas"},
	{"replicas -1", func(rt *v1alpha1.Runtime) { rt.Spec.Replicas = -1 }, "spec.replicas"},
	{"runs 0", func(rt *v1alpha1.Runtime) { rt.Spec.Runs = 0 }, "spec.runs"},
	{"runs 1", func(rt *v1alpha1.Runtime) { rt.Spec.Runs = 1 }, ""},
	{"runs 1024", func(rt *v1alpha1.Runtime) { rt.Spec.Runs = 1024 }, ""},
	{"runs 1025", func(rt *v1alpha1.Runtime) { rt.Spec.Runs = 1025 }, "spec.runs"},
	{"task timeout 0", func(rt *v1alpha1.Runtime) { rt.Spec.DefaultTaskTimeout = &metav1.Duration{} }, ""},
	{"task timeout negative", func(rt *v1alpha1.Runtime) {
		rt.Spec.DefaultTaskTimeout = &metav1.Duration{Duration: -1}
	}, "spec.defaultTaskTimeout"},
	{"function timeout negative", func(rt *v1alpha1.Runtime) {
		rt.Spec.DefaultFunctionTimeout = &metav1.Duration{Duration: -1}
	}, "spec.defaultFunctionTimeout"},
	{"invoke timeout negative", func(rt *v1alpha1.Runtime) {
		rt.Spec.DefaultInvokeTimeout = &metav1.Duration{Duration: -1}
	}, "spec.defaultInvokeTimeout"},
	{"lambda image", func(rt *v1alpha1.Runtime) {
		rt.Spec.Server = "lambda"
		rt.Spec.Lambda = &v1alpha1.LambdaSpec{Runtime: "python", Role: "arn:aws:iam::1:role/x", Image: "1.dkr.ecr.eu-west-1.amazonaws.com/fn:1"}
	}, ""},
	{"lambda image with spaces", func(rt *v1alpha1.Runtime) {
		rt.Spec.Server = "lambda"
		rt.Spec.Lambda = &v1alpha1.LambdaSpec{Runtime: "python", Role: "arn:aws:iam::1:role/x", Image: "fn 1"}
	}, "spec.lambda.image"},
	{"git credentials", func(rt *v1alpha1.Runtime) {
		rt.Spec.Git = &v1alpha1.RuntimeGit{CredentialsSecret: "git-creds"}
	}, ""},
	{"git credentials not a name", func(rt *v1alpha1.Runtime) {
		rt.Spec.Git = &v1alpha1.RuntimeGit{CredentialsSecret: "Git_Creds"}
	}, "spec.git.credentialsSecret"},
	{"lambda image and bootstrap", func(rt *v1alpha1.Runtime) {
		rt.Spec.Server = "lambda"
		rt.Spec.Lambda = &v1alpha1.LambdaSpec{Runtime: "python", Role: "arn:aws:iam::1:role/x", Image: "fn:1", Bootstrap: "/opt/stoke"}
	}, "spec.lambda.image"},
}

func TestValidateRuntime(t *testing.T) {
	for _, tt := range runtimeCases {
		t.Run(tt.name, func(t *testing.T) {
			rt := validRuntime()
			tt.mutate(rt)
			checkErr(t, ValidateRuntime(rt), tt.field)
		})
	}
}

var runtimeUpdateCases = []runtimeCase{
	{"scale", func(rt *v1alpha1.Runtime) { rt.Spec.Replicas = 5 }, ""},
	{"more runs", func(rt *v1alpha1.Runtime) { rt.Spec.Runs = 16 }, ""},
	{"timeouts", func(rt *v1alpha1.Runtime) { rt.Spec.DefaultInvokeTimeout = nil }, ""},
	{"runs invalid", func(rt *v1alpha1.Runtime) { rt.Spec.Runs = 0 }, "spec.runs"},
	{"server", func(rt *v1alpha1.Runtime) { rt.Spec.Server = "python" }, "spec.server"},
	{"name", func(rt *v1alpha1.Runtime) { rt.Name = "other" }, "metadata.name"},
	{"uid", func(rt *v1alpha1.Runtime) { rt.UID = "rt-2" }, "metadata.uid"},
}

func TestValidateRuntimeUpdate(t *testing.T) {
	for _, tt := range runtimeUpdateCases {
		t.Run(tt.name, func(t *testing.T) {
			old := validRuntime()
			nw := old.DeepCopy()
			tt.mutate(nw)
			checkErr(t, ValidateRuntimeUpdate(old, nw), tt.field)
		})
	}
}

func TestSetRunDefaults(t *testing.T) {
	r := &v1alpha1.Run{
		ObjectMeta: metav1.ObjectMeta{Name: "x"},
		Spec: v1alpha1.RunSpec{
			Runtime: "bash",
			Mode:    v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"true"}}},
		},
	}
	if err := ValidateRun(r); err == nil {
		t.Fatal("a Run without a namespace validated before defaulting")
	}
	SetRunDefaults(r)
	if r.Namespace != "default" || r.APIVersion != "stoke.dev/v1alpha1" || r.Kind != "Run" {
		t.Errorf("metadata not defaulted: %+v %+v", r.TypeMeta, r.ObjectMeta)
	}
	if rp := r.Spec.RetryPolicy; rp == nil || rp.MaxAttempts != 1 || rp.Backoff != nil {
		t.Errorf("retryPolicy = %+v, want maxAttempts 1 and no backoff", rp)
	}
	if err := ValidateRun(r); err != nil {
		t.Fatalf("defaulted Run invalid: %v", err)
	}
	before := r.DeepCopy()
	SetRunDefaults(r)
	if !equalRuns(before, r) {
		t.Error("SetRunDefaults is not idempotent")
	}

	set := taskRun()
	set.Namespace = "ci"
	want := set.DeepCopy()
	SetRunDefaults(set)
	if !equalRuns(want, set) {
		t.Error("SetRunDefaults overwrote set values")
	}

	zero := taskRun()
	zero.Spec.RetryPolicy.MaxAttempts = 0
	SetRunDefaults(zero)
	if zero.Spec.RetryPolicy.MaxAttempts != 1 || zero.Spec.RetryPolicy.RetryableReasons[0] != "PodGone" {
		t.Errorf("retryPolicy = %+v", zero.Spec.RetryPolicy)
	}
	SetRunDefaults(nil) // does not panic
}

func TestSetRuntimeDefaults(t *testing.T) {
	rt := &v1alpha1.Runtime{ObjectMeta: metav1.ObjectMeta{Name: "py"}, Spec: v1alpha1.RuntimeSpec{Server: "python"}}
	SetRuntimeDefaults(rt)
	if rt.Namespace != "default" || rt.Spec.Runs != 1 || rt.Spec.Replicas != 0 || rt.Kind != "Runtime" {
		t.Errorf("got %+v", rt)
	}
	if err := ValidateRuntime(rt); err != nil {
		t.Fatal(err)
	}
	SetRuntimeDefaults(nil)
}
