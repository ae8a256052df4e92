package cli_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/cli"
	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/errdefs"
)

func ptr[T any](v T) *T { return &v }

func TestTaskResult(t *testing.T) {
	run := func(phase v1alpha1.Phase, reason string, exit *int32, msg string) *v1alpha1.Run {
		return &v1alpha1.Run{ObjectMeta: metav1.ObjectMeta{Name: "t"},
			Status: v1alpha1.RunStatus{Phase: phase, Reason: reason, ExitCode: exit, Message: msg}}
	}
	for _, tc := range []struct {
		name string
		run  *v1alpha1.Run
		code int
		msg  string
	}{
		{"succeeded", run(v1alpha1.PhaseSucceeded, "Succeeded", ptr(int32(0)), ""), 0, ""},
		{"its own exit code, silently", run(v1alpha1.PhaseFailed, "NonZeroExit", ptr(int32(3)), "exit status 3"), 3, ""},
		{"timeout", run(v1alpha1.PhaseTimeout, "Timeout", ptr(int32(143)), "exceeded its timeout of 1s"), cli.ExitTimeout, "run/t Timeout, exit code 143: exceeded its timeout of 1s"},
		{"cancelled", run(v1alpha1.PhaseCancelled, "Cancelled", nil, ""), cli.ExitFailed, "run/t Cancelled"},
		{"failed without a code", run(v1alpha1.PhaseFailed, "RuntimeExecute", nil, "bash: no such file\nmore"), cli.ExitFailed, "run/t Failed (RuntimeExecute): bash: no such file …"},
		{"an exit code a process cannot have", run(v1alpha1.PhaseFailed, "NonZeroExit", ptr(int32(-1)), "killed"), cli.ExitFailed, "run/t Failed (NonZeroExit), exit code -1: killed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := cli.TaskResult(tc.run)
			if tc.code == 0 {
				if err != nil {
					t.Fatalf("TaskResult = %v, want nil", err)
				}
				return
			}
			var ee *cli.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != tc.code {
				t.Fatalf("TaskResult = %v, want exit %d", err, tc.code)
			}
			if got := ""; ee.Err != nil {
				got = ee.Err.Error()
				if got != tc.msg {
					t.Errorf("message %q, want %q", got, tc.msg)
				}
			} else if tc.msg != "" {
				t.Errorf("no message, want %q", tc.msg)
			}
		})
	}
}

func TestReadInput(t *testing.T) {
	big := filepath.Join(t.TempDir(), "big.json")
	if err := os.WriteFile(big, make([]byte, bounds.InvokeBody+1), 0o600); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "in.json")
	if err := os.WriteFile(file, []byte(`{"from":"file"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		data, stdin, want, err string
	}{
		{data: "", want: "{}"},
		{data: `{"a":1}`, want: `{"a":1}`},
		{data: "@" + file, want: `{"from":"file"}`},
		{data: "-", stdin: `[1,2]`, want: `[1,2]`},
		{data: "{not json", err: "-d is not valid JSON"},
		{data: "-", stdin: "nope", err: "standard input is not valid JSON"},
		{data: "@/does/not/exist", err: "reading the input"},
		{data: "-", stdin: `"` + strings.Repeat("x", bounds.InvokeBody) + `"`, err: "exceeds"},
		{data: "@" + big, err: "exceeds"},
	} {
		got, err := cli.ReadInput(tc.data, strings.NewReader(tc.stdin))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ReadInput(%.20q) = %v, want an error containing %q", tc.data, err, tc.err)
			}
			continue
		}
		if err != nil || string(got) != tc.want {
			t.Errorf("ReadInput(%.20q) = %q, %v; want %q", tc.data, got, err, tc.want)
		}
	}
}

func TestHint(t *testing.T) {
	joined := errors.Join(errors.New("a: bad"), errors.New("b: bad"))
	if got := cli.Hint(joined).Error(); got != "a: bad; b: bad" {
		t.Errorf("Hint(joined) = %q", got)
	}
	if !errors.Is(cli.Hint(fmt.Errorf("x: %w", errdefs.ErrNotFound)), errdefs.ErrNotFound) {
		t.Error("Hint lost the category")
	}
	unreachable := &client.UnreachableError{Server: "http://127.0.0.1:1", Err: &net.OpError{Op: "dial", Err: errors.New("connection refused")}}
	if got := cli.Hint(unreachable).Error(); !strings.Contains(got, `is "stoke up" running?`) || !strings.Contains(got, "http://127.0.0.1:1") {
		t.Errorf("Hint(unreachable) = %q", got)
	}
	if got := cli.Hint(errdefs.Errorf(errdefs.ErrUnauthenticated, "missing or wrong bearer token")).Error(); !strings.Contains(got, "--token") {
		t.Errorf("Hint(unauthenticated) = %q", got)
	}
	if cli.Hint(nil) != nil {
		t.Error("Hint(nil) is not nil")
	}
}

func TestInvokeURL(t *testing.T) {
	c, err := client.New(client.Config{Server: "https://stoke.example/prefix"})
	if err != nil {
		t.Fatal(err)
	}
	for ep, want := range map[string]string{
		"http://127.0.0.1:7070/v1/namespaces/d/runs/f/u/invoke": "http://127.0.0.1:7070/v1/namespaces/d/runs/f/u/invoke",
		"/v1/namespaces/d/runs/f/u/invoke":                      "https://stoke.example/prefix/v1/namespaces/d/runs/f/u/invoke",
	} {
		run := &v1alpha1.Run{Status: v1alpha1.RunStatus{Endpoint: ep}}
		if got := c.InvokeURL(run); got != want {
			t.Errorf("InvokeURL(%q) = %q, want %q", ep, got, want)
		}
	}
}

func TestSameRunSpec(t *testing.T) {
	a := v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"x"}}}}
	b := *a.DeepCopy()
	b.CancelRequested = true
	if !cli.SameRunSpec(&a, &b) {
		t.Error("a cancelled Run differs from its manifest")
	}
	b.Env = []v1alpha1.EnvVar{{Name: "A", Value: "1"}}
	if cli.SameRunSpec(&a, &b) {
		t.Error("Runs with different env are the same")
	}
}

func TestParseKind(t *testing.T) {
	for in, want := range map[string]cli.Kind{"run": cli.KindRun, "runs": cli.KindRun, "runtime": cli.KindRuntime, "runtimes": cli.KindRuntime, "rt": cli.KindRuntime, "function": cli.KindFunction, "functions": cli.KindFunction, "fn": cli.KindFunction, "workflowruns": cli.KindWorkflowRun, "wfr": cli.KindWorkflowRun, "workflow": cli.KindWorkflow, "wf": cli.KindWorkflow} {
		if got, err := cli.ParseKind(in); err != nil || got != want {
			t.Errorf("ParseKind(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := cli.ParseKind("pods"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("ParseKind(pods) = %v", err)
	}
}
