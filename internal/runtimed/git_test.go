package runtimed_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/gitsource"
	"stoke.dev/stoke/internal/gitsource/gittest"
)

// source.git checks a commit out into the working directory (at its
// path), with an inline file written over it; a ref is resolved once and
// recorded in status.sourceCommit; a Run that changes its checkout leaves
// the cache as it was; bad sources fail with a clear message.
func TestGitSource(t *testing.T) {
	srv := gittest.NewServer(t, gittest.Options{})
	first, url := srv.Commit(t, "app", map[string]string{"VERSION": "1\n", "lib/util.sh": "util() { echo util; }\n", "lib/link": "link:util.sh"})
	bad, badURL := srv.Commit(t, "evil", map[string]string{"out": "link:../../x"})
	cacheDir := filepath.Join(t.TempDir(), "git")
	cache, err := gitsource.New(gitsource.Config{Dir: cacheDir})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvWith(t, "bash", envOptions{git: cache})

	ref := taskRun("ref", `read -r v < src/VERSION; . src/lib/link; echo "V=$v U=$(util)" >> "$STOKE_OUTPUTS"; echo changed > src/VERSION`)
	ref.Spec.Source.Git = &v1alpha1.GitSource{URL: url, Ref: "main", Path: "src"}
	e.submit(ref)
	got := e.waitPhase("ref", v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed)
	if got.Status.Phase != v1alpha1.PhaseSucceeded || got.Status.Outputs["V"] != "1 U=util" || got.Status.SourceCommit != first {
		t.Fatalf("ref: %+v (commit %s)", got.Status, first)
	}
	// The checkout was the Run's to change; the cache's tree is not.
	pinned := taskRun("pinned", `read -r v < VERSION; echo "V=$v" >> "$STOKE_OUTPUTS"`)
	pinned.Spec.Source.Git = &v1alpha1.GitSource{URL: url, Commit: first}
	e.submit(pinned)
	got = e.waitPhase("pinned", v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed)
	if got.Status.Phase != v1alpha1.PhaseSucceeded || got.Status.Outputs["V"] != "1" {
		t.Fatalf("pinned: %+v", got.Status)
	}
	fetches := srv.Fetches.Load()
	for _, tc := range []struct {
		name   string
		src    v1alpha1.GitSource
		reason string
		msg    string
	}{
		{"not-a-repo", v1alpha1.GitSource{URL: srv.URL + "/none.git", Ref: "main"}, "SourceFetchFailed", "none.git"},
		{"unknown-commit", v1alpha1.GitSource{URL: url, Commit: strings.Repeat("0", 40)}, "SourceFetchFailed", "not our ref"},
		{"unknown-ref", v1alpha1.GitSource{URL: url, Ref: "nope"}, "SourceFetchFailed", `ref "nope" is not in`},
		{"link-out", v1alpha1.GitSource{URL: badURL, Commit: bad}, "InvalidSpec", `entry "out": a link to`},
	} {
		run := taskRun(tc.name, "true")
		run.Spec.Source.Git = &tc.src
		e.submit(run)
		got := e.waitPhase(tc.name, v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed)
		if got.Status.Phase != v1alpha1.PhaseFailed || got.Status.Reason != tc.reason || !strings.Contains(got.Status.Message, tc.msg) {
			t.Errorf("%s: %s %s %q; want %s saying %q", tc.name, got.Status.Phase, got.Status.Reason, got.Status.Message, tc.reason, tc.msg)
		}
	}
	if srv.Fetches.Load() == fetches {
		t.Error("the bad sources asked the server nothing")
	}
	if _, err := os.Stat(filepath.Join(e.pod.WorkspaceRoot, "..", "x")); !os.IsNotExist(err) {
		t.Errorf("written outside: %v", err)
	}
}

// In Kubernetes mode (runtimed.Config.GitSecret) a Run fetches with its
// Runtime's credentials only when its source.git.credentialsSecret names
// that Runtime's Secret; naming none fetches without them (a private
// repository then fails as git reports it), and naming another Secret is
// refused before anything is fetched.
func TestGitCredentialsSecretMustBeTheRuntimes(t *testing.T) {
	const password = "pw-kube-7c1d"
	srv := gittest.NewServer(t, gittest.Options{User: "ci", Password: password})
	commit, url := srv.Commit(t, "private", map[string]string{"VERSION": "3\n"})
	file := filepath.Join(t.TempDir(), "git-credentials")
	if err := os.WriteFile(file, []byte(strings.Replace(srv.URL, "http://", "http://ci:"+password+"@", 1)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	creds, err := gitsource.OpenCredentialsFile(file)
	if err != nil {
		t.Fatal(err)
	}
	cache, err := gitsource.New(gitsource.Config{Dir: filepath.Join(t.TempDir(), "git"), Credentials: creds})
	if err != nil {
		t.Fatal(err)
	}
	secret := "git-creds"
	e := newEnvWith(t, "bash", envOptions{git: cache, gitSecret: &secret})

	ok := taskRun("named", `read -r v < VERSION; echo "V=$v" >> "$STOKE_OUTPUTS"`)
	ok.Spec.Source.Git = &v1alpha1.GitSource{URL: url, Commit: commit, CredentialsSecret: secret}
	e.submit(ok)
	if got := e.waitPhase("named", v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed); got.Status.Phase != v1alpha1.PhaseSucceeded || got.Status.Outputs["V"] != "3" {
		t.Fatalf("naming the Runtime's Secret: %s %s %q", got.Status.Phase, got.Status.Reason, got.Status.Message)
	}
	for _, tc := range []struct {
		name, secret, reason, msg string
	}{
		{"unnamed", "", "SourceFetchFailed", "the repository asks for credentials: set spec.source.git.credentialsSecret to the Runtime's spec.git.credentialsSecret"},
		// The commit "named" fetched is in the cache: not for a Run
		// without the credentials.
		{"unnamed-cached", "", "SourceFetchFailed", "the repository asks for credentials"},
		{"other", "someone-elses", "InvalidSpec", `spec.source.git.credentialsSecret: "someone-elses" is not the Secret of Runtime bash (spec.git.credentialsSecret "git-creds")`},
	} {
		run := taskRun(tc.name, "true")
		run.Spec.Source.Git = &v1alpha1.GitSource{URL: url, Ref: "main", CredentialsSecret: tc.secret}
		if tc.name == "unnamed-cached" {
			run.Spec.Source.Git = &v1alpha1.GitSource{URL: url, Commit: commit}
		}
		e.submit(run)
		got := e.waitPhase(tc.name, v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed)
		if got.Status.Phase != v1alpha1.PhaseFailed || got.Status.Reason != tc.reason || !strings.Contains(got.Status.Message, tc.msg) {
			t.Errorf("%s: %s %s %q; want %s saying %q", tc.name, got.Status.Phase, got.Status.Reason, got.Status.Message, tc.reason, tc.msg)
		}
		if strings.Contains(got.Status.Message, password) {
			t.Errorf("%s: the message holds the password", tc.name)
		}
	}
	if len(srv.Authorizations()) == 0 {
		t.Error("the server saw no credentials")
	}
	// No Secret on the Runtime: a Run naming one is refused.
	none := ""
	e2 := newEnvWith(t, "bash", envOptions{git: cache, gitSecret: &none})
	run := taskRun("no-runtime-secret", "true")
	run.Spec.Source.Git = &v1alpha1.GitSource{URL: url, Commit: commit, CredentialsSecret: secret}
	e2.submit(run)
	if got := e2.waitPhase("no-runtime-secret", v1alpha1.PhaseSucceeded, v1alpha1.PhaseFailed); got.Status.Phase != v1alpha1.PhaseFailed ||
		got.Status.Reason != "InvalidSpec" || !strings.Contains(got.Status.Message, "Runtime bash has no spec.git.credentialsSecret") {
		t.Errorf("no Secret on the Runtime: %s %s %q", got.Status.Phase, got.Status.Reason, got.Status.Message)
	}
}
