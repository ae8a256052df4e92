package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/gitsource/gittest"
)

// What a workflow job's steps need of the Run layer, through stoke up (as
// root: the Runs run as its unprivileged user): a checkout of a private
// repository's ref into a shared workspace, with the credentials from
// --git-credentials; later steps pinned to the same pod, finding the
// files of the earlier ones, writing $GITHUB_OUTPUT and $GITHUB_ENV; the
// last releasing the workspace; a step pinned to a pod that is no longer
// there ends Unschedulable.
func TestJobStepsOnOnePod(t *testing.T) {
	const password = "pw-e2e-3f9a"
	srv := gittest.NewServer(t, gittest.Options{User: "ci", Password: password})
	commit, url := srv.Commit(t, "app", map[string]string{"VERSION": "7\n", "build.sh": "echo built > out.txt\n"})
	creds := filepath.Join(t.TempDir(), "git-credentials")
	if err := os.WriteFile(creds, []byte(strings.Replace(srv.URL, "http://", "http://ci:"+password+"@", 1)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	u := startUp(t, dataDir, "--git-credentials", creds)
	w := u.watchRuns(t)
	defer w.stop()

	step := func(name, script string, pl v1alpha1.Placement) *v1alpha1.Run {
		run := taskRun(name, script)
		run.Spec.Placement = &pl
		return run
	}
	checkout := step("checkout", "./build.sh", v1alpha1.Placement{Workspace: "job-e2e"})
	checkout.Spec.Source = &v1alpha1.Source{Git: &v1alpha1.GitSource{URL: url, Ref: "main"}}
	got := runToEnd(t, u, w, checkout)
	if got.Status.Phase != v1alpha1.PhaseSucceeded || got.Status.SourceCommit != commit {
		t.Fatalf("checkout: %s %s %q (sourceCommit %s, want %s)", got.Status.Phase, got.Status.Reason, got.Status.Message, got.Status.SourceCommit, commit)
	}
	pod := got.Status.AssignedPodUID
	ws := v1alpha1.Placement{PodUID: pod, Workspace: "job-e2e"}

	got = runToEnd(t, u, w, step("outputs", `read -r v < VERSION; read -r b < out.txt
echo "version=$v" >> "$GITHUB_OUTPUT"
{ echo "notes<<EOF"; echo "$b"; echo "two"; echo EOF; } >> "$GITHUB_OUTPUT"
echo "BUILT=$b" >> "$GITHUB_ENV"
echo more > more.txt`, ws))
	if got.Status.Phase != v1alpha1.PhaseSucceeded || got.Status.AssignedPodUID != pod ||
		got.Status.Outputs["version"] != "7" || got.Status.Outputs["notes"] != "built\ntwo" ||
		!slices.Equal(got.Status.Env, []v1alpha1.EnvVar{{Name: "BUILT", Value: "built"}}) {
		t.Fatalf("outputs: %+v", got.Status)
	}

	last := ws
	last.ReleaseWorkspace = true
	got = runToEnd(t, u, w, step("last", `read -r m < more.txt; echo "m=$m" >> "$STOKE_OUTPUTS"`, last))
	if got.Status.Phase != v1alpha1.PhaseSucceeded || got.Status.AssignedPodUID != pod || got.Status.Outputs["m"] != "more" {
		t.Fatalf("last: %+v", got.Status)
	}
	wsDir := filepath.Join(dataDir, "runs", "ws-job-e2e")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) { // polling an observable state
		if _, err := os.Lstat(wsDir); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the released workspace is still there")
		}
	}

	got = runToEnd(t, u, w, step("lost", "true", v1alpha1.Placement{PodUID: "0e5f1c1e-0000-4000-8000-000000000000", Workspace: "job-e2e"}))
	if got.Status.Phase != v1alpha1.PhaseFailed || got.Status.Reason != "Unschedulable" || !strings.Contains(got.Status.Message, "0e5f1c1e-0000-4000-8000-000000000000") {
		t.Errorf("lost: %s %s %q", got.Status.Phase, got.Status.Reason, got.Status.Message)
	}
	if len(srv.Authorizations()) == 0 {
		t.Error("the server saw no credentials")
	}
	for _, line := range u.Log() {
		if strings.Contains(line, password) {
			t.Errorf("stoke up logged the password: %s", line)
		}
	}
}
