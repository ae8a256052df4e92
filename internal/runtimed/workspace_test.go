package runtimed_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

func inWorkspace(run *v1alpha1.Run, name string, release bool) *v1alpha1.Run {
	run.Spec.Placement = &v1alpha1.Placement{Workspace: name, ReleaseWorkspace: release}
	return run
}

// Runs naming one workspace share it as their working directory: what the
// first leaves is there for the next; a source written over a link the
// Runs left fails the Run and writes nothing outside; the Run that
// releases the workspace removes it when it ends.
func TestSharedWorkspace(t *testing.T) {
	e := newEnv(t, "bash")
	outside := t.TempDir()
	ws := filepath.Join(e.pod.WorkspaceRoot, "ws-job-1")

	first := inWorkspace(taskRun("first", `echo one > a.txt; mkdir d; ln -s "$OUTSIDE" d/out; echo "DIR=$PWD" >> "$STOKE_OUTPUTS"`), "job-1", false)
	first.Spec.Env = append(first.Spec.Env, v1alpha1.EnvVar{Name: "OUTSIDE", Value: outside})
	e.submit(first)
	got := e.waitPhase("first", v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed)
	if got.Status.Phase != v1alpha1.PhaseSucceeded || got.Status.Outputs["DIR"] != ws {
		t.Fatalf("first: %+v", got.Status)
	}
	if _, err := os.Stat(filepath.Join(ws, "a.txt")); err != nil {
		t.Fatalf("the workspace is not kept after a Run that does not release it: %v", err)
	}

	escape := inWorkspace(taskRun("escape", "true"), "job-1", false)
	escape.Spec.Source.Inline.Path = "d/out/planted.sh"
	e.submit(escape)
	got = e.waitPhase("escape", v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed)
	if got.Status.Phase != v1alpha1.PhaseFailed || got.Status.Reason != "InvalidSpec" || !strings.Contains(got.Status.Message, "d/out/planted.sh") {
		t.Errorf("escape: %+v", got.Status)
	}
	if names, _ := os.ReadDir(outside); len(names) != 0 {
		t.Errorf("written outside the workspace: %v", names)
	}

	last := inWorkspace(taskRun("last", `read -r v < a.txt; echo "A=$v" >> "$STOKE_OUTPUTS"`), "job-1", true)
	e.submit(last)
	got = e.waitPhase("last", v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed)
	if got.Status.Phase != v1alpha1.PhaseSucceeded || got.Status.Outputs["A"] != "one" {
		t.Fatalf("last: %+v", got.Status)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) { // polling an observable state
		if _, err := os.Lstat(ws); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the released workspace is still there")
		}
	}
	if _, err := os.Stat(outside); err != nil {
		t.Errorf("releasing the workspace removed what its link pointed to: %v", err)
	}
}

// A task's $GITHUB_OUTPUT lands in status.outputs beside $STOKE_OUTPUTS',
// its $GITHUB_ENV in status.env, its $GITHUB_STEP_SUMMARY in
// status.summary; a heredoc without its delimiter fails the
// task, naming the file.
func TestGitHubFileCommands(t *testing.T) {
	e := newEnv(t, "bash")
	e.submit(taskRun("gh", `echo "S=stoke" >> "$STOKE_OUTPUTS"
echo "g=github" >> "$GITHUB_OUTPUT"
{ echo "multi<<EOF"; echo "line 1"; echo "line 2"; echo "EOF"; } >> "$GITHUB_OUTPUT"
echo "B_VAR=b" >> "$GITHUB_ENV"
printf 'A_VAR<<X\r\nx y\r\nX\r\n' >> "$GITHUB_ENV"
echo "## Summary" >> "$GITHUB_STEP_SUMMARY"`))
	got := e.waitPhase("gh", v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed)
	if got.Status.Phase != v1alpha1.PhaseSucceeded {
		t.Fatalf("status %+v", got.Status)
	}
	if o := got.Status.Outputs; o["S"] != "stoke" || o["g"] != "github" || o["multi"] != "line 1\nline 2" || len(o) != 3 {
		t.Errorf("outputs %q", o)
	}
	want := []v1alpha1.EnvVar{{Name: "A_VAR", Value: "x y"}, {Name: "B_VAR", Value: "b"}}
	if !slices.Equal(got.Status.Env, want) {
		t.Errorf("env %+v, want %+v", got.Status.Env, want)
	}
	if got.Status.Summary != "## Summary\n" {
		t.Errorf("summary %q", got.Status.Summary)
	}

	e.submit(taskRun("bad", `{ echo "h<<EOF"; echo never closed; } >> "$GITHUB_OUTPUT"`))
	got = e.waitPhase("bad", v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed)
	if got.Status.Phase != v1alpha1.PhaseFailed || !strings.Contains(got.Status.Message, `$GITHUB_OUTPUT line 1: the delimiter "EOF" of "h" never comes`) {
		t.Errorf("bad: %+v", got.Status)
	}
}
