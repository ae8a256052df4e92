package manifest_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"stoke.dev/stoke/internal/cli/manifest"
	"stoke.dev/stoke/internal/errdefs"
)

const twoDocs = `# leading comment
---
apiVersion: stoke.dev/v1alpha1
kind: Runtime
metadata:
  name: small
spec:
  server: bash
  replicas: 1
---
# only a comment
---
apiVersion: stoke.dev/v1alpha1
kind: Run
metadata:
  generateName: job-
  namespace: ci
  uid: 1234
  resourceVersion: "9"
spec:
  runtime: small
  mode:
    task:
      args: [echo, hi]
status:
  phase: Succeeded
`

func TestParse(t *testing.T) {
	objs, err := manifest.Parse(strings.NewReader(twoDocs), "two.yaml", "dev")
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 {
		t.Fatalf("Parse = %d objects, want 2", len(objs))
	}
	rt, run := objs[0].Runtime, objs[1].Run
	if rt == nil || run == nil || objs[0].Index != 1 || objs[1].Index != 2 {
		t.Fatalf("Parse = %+v", objs)
	}
	// Defaults are set; a missing namespace is the one given.
	if rt.Namespace != "dev" || rt.Spec.Runs != 1 || rt.Kind != "Runtime" {
		t.Errorf("runtime = %+v", rt)
	}
	if run.Namespace != "ci" || run.Spec.RetryPolicy == nil || run.Spec.RetryPolicy.MaxAttempts != 1 {
		t.Errorf("run = %+v", run)
	}
	// What the server sets is dropped, so `get -o yaml` output re-applies.
	if run.UID != "" || run.ResourceVersion != "" || run.Status.Phase != "" {
		t.Errorf("server fields kept: uid %q rv %q phase %q", run.UID, run.ResourceVersion, run.Status.Phase)
	}
	if objs[0].Ref() != "runtime/small" || objs[1].Ref() != "run/job-*" {
		t.Errorf("refs %s %s", objs[0].Ref(), objs[1].Ref())
	}
}

func TestParseJSON(t *testing.T) {
	objs, err := manifest.Parse(strings.NewReader(`{"apiVersion":"stoke.dev/v1alpha1","kind":"Run","metadata":{"name":"j"},"spec":{"runtime":"bash","mode":{"task":{"args":["true"]}}}}`), "run.json", "default")
	if err != nil || len(objs) != 1 || objs[0].Run.Name != "j" {
		t.Fatalf("Parse = %+v, %v", objs, err)
	}
}

func TestParseErrorsNameTheDocument(t *testing.T) {
	const good = "apiVersion: stoke.dev/v1alpha1\nkind: Run\nmetadata: {name: ok}\nspec: {runtime: bash, mode: {task: {args: [x]}}}\n"
	for _, tc := range []struct {
		name, input, want string
	}{
		{"not YAML", good + "---\nkind: [unclosed\n", "f.yaml: document 2: "},
		{"no kind", good + "---\napiVersion: stoke.dev/v1alpha1\n", "document 2: kind is missing"},
		{"other kind", "apiVersion: stoke.dev/v1alpha1\nkind: Pod\n", "document 1: kind \"Pod\" is not served"},
		{"other version", "apiVersion: v1\nkind: Run\n", "document 1: apiVersion \"v1\" is not served"},
		{"unknown field", good + "---\n" + strings.Replace(good, "spec:", "extra: 1\nspec:", 1), "document 2: bad Run: unknown field \"extra\""},
		{"misspelt nested field", strings.Replace(good, "args", "argz", 1), "document 1: bad Run: unknown field \"argz\""},
		{"invalid", strings.Replace(good, "args: [x]", "args: []", 1), "document 1: run/ok: spec.mode.task: entrypoint or args must be set"},
		{"two problems on one line", strings.Replace(good, "runtime: bash", "runtime: ''", 1) + "", "spec.runtime: must not be empty"},
		{"repeated", good + "---\n" + good, "document 2: run/ok repeats document 1"},
		{"empty", "# nothing\n---\n", "holds no Run, Runtime, Function, WorkflowRun or Workflow"},
		{"aliases past the bound", "apiVersion: stoke.dev/v1alpha1\nkind: Run\nmetadata:\n  name: amp\n  labels: {a: &big " + strings.Repeat("x", 3900<<10) + "}\n  annotations: {" +
			strings.Repeat("k: *big, ", 99) + "}\nspec: {runtime: bash, mode: {task: {args: [x]}}}\n", "document 1: text: its YAML aliases expand it past"},
		{"not UTF-8", strings.Replace(good, "args: [x]", "args: [caf\xe9]", 1), "document 1: text: is not UTF-8 text: byte"},
		{"function with min > max", "apiVersion: stoke.dev/v1alpha1\nkind: Function\nmetadata: {name: f}\nspec: {runtime: python, handler: m.h, scale: {min: 3, max: 2}}\n", "document 1: function/f: spec.scale: scale.min must not exceed scale.max"},
		{"function misspelt", "apiVersion: stoke.dev/v1alpha1\nkind: Function\nmetadata: {name: f}\nspec: {runtime: python, handler: m.h, scael: {}}\n", "document 1: bad Function: unknown field \"scael\""},
		{"runtime without server", "apiVersion: stoke.dev/v1alpha1\nkind: Runtime\nmetadata: {name: r}\nspec: {replicas: 1}\n", "runtime/r: spec.server: must not be empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := manifest.Parse(strings.NewReader(tc.input), "f.yaml", "default")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse = %v, want an error containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("the error has more than one line: %q", err)
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("Parse = %v, not InvalidArgument", err)
			}
		})
	}
}

func TestParseBoundsTheFile(t *testing.T) {
	big := strings.NewReader(strings.Repeat("#", manifest.MaxFile+1))
	if _, err := manifest.Parse(big, "big.yaml", "default"); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Errorf("Parse = %v, want TooLarge", err)
	}
}

// The examples in the repository parse, and the sources inlined in their
// manifests are the example files themselves.
func TestExamples(t *testing.T) {
	root := filepath.Join("..", "..", "..", "examples")
	files, err := filepath.Glob(filepath.Join(root, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples: %v", err)
	}
	inlined := map[string]string{
		"task.yaml":            "task/task.sh",
		"bash-function.yaml":   "bash-echo/handler.sh",
		"python-function.yaml": "python-hello/hello.py",
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			r, err := os.Open(f)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			objs, err := manifest.Parse(r, f, "default")
			if err != nil {
				t.Fatal(err)
			}
			want, ok := inlined[filepath.Base(f)]
			if !ok {
				return
			}
			b, err := os.ReadFile(filepath.Join(root, want))
			if err != nil {
				t.Fatal(err)
			}
			src := objs[0].Run.Spec.Source
			if src == nil || src.Inline == nil || src.Inline.Text != string(b) || src.Inline.Path != filepath.Base(want) {
				t.Errorf("the inline source differs from %s; regenerate the manifest from it", want)
			}
		})
	}
}
