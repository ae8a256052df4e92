package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/runtimed"
)

// Exec into a task Run on a lambda Runtime reaches the task in its Lambda
// sandbox through the reverse agent, with the CLI and the HTTP route of a
// local Run: never the Runtime Server's machine (where `stoke exec` used to
// run the command, in the Run's local working directory).
func TestExecIntoALambdaTask(t *testing.T) {
	startLambda(t, 20)
	u := startUp(t, t.TempDir())
	launcher := filepath.Join(t.TempDir(), "launcher")
	if err := os.WriteFile(launcher, []byte("#!/usr/bin/env bash\nexec -a bootstrap "+stokeBin+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	u.applyLambdaRuntime(t, "lambda-bash", "bash", launcher)
	w := u.watchRuns(t)
	defer func() { w.stop() }()
	u.createRun(t, newRun("lhang", task("lambda-bash", "t.sh", "sleep 100000\n")))
	w.until(t, 180*time.Second, "lhang running", func(runs map[string]*v1alpha1.Run) bool {
		return runs["lhang"] != nil && runs["lhang"].Status.Phase == v1alpha1.PhaseRunning
	})
	env := []string{"STOKE_SERVER=" + u.URL, "STOKE_TOKEN=" + u.Token}

	t.Run("RunsInTheSandbox", func(t *testing.T) {
		// The first exec may wait for the agent to dial back.
		r := stoke(t, env, "", "exec", "lhang", "--", "sh", "-c", `echo "fn=$AWS_LAMBDA_FUNCTION_NAME"; pwd; echo "root=$LAMBDA_TASK_ROOT"`)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		if r.code != 0 || len(lines) != 3 || lines[0] == "fn=" || "root="+lines[1] != lines[2] {
			t.Fatalf("%s; want the sandbox's function name and task root", r)
		}
	})

	t.Run("DescribeSaysTheAgentIsConnected", func(t *testing.T) {
		// RunsInTheSandbox's exec reached the agent: it is connected.
		w.until(t, 60*time.Second, "lhang's AgentConnected True", func(runs map[string]*v1alpha1.Run) bool {
			c := meta.FindStatusCondition(runs["lhang"].Status.Conditions, runtimed.ConditionAgentConnected)
			return c != nil && c.Status == metav1.ConditionTrue
		})
		if r := stoke(t, env, "", "describe", "run", "lhang"); r.code != 0 || !regexp.MustCompile(`AgentConnected:\s+True Connected`).MatchString(r.stdout) {
			t.Fatalf("%s; want AgentConnected True", r)
		}
	})

	t.Run("StdinEOF", func(t *testing.T) {
		if r := stoke(t, env, "hello", "exec", "-i", "lhang", "--", "wc", "-c"); r.code != 0 || r.stdout != "5\n" {
			t.Errorf("%s", r)
		}
	})

	t.Run("Terminal", func(t *testing.T) { execTerminal(t, env, "lhang") })

	t.Run("ClientGo", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cfg := &rest.Config{Host: u.URL, BearerToken: u.Token}
		url := u.URL + "/v1/namespaces/default/runs/lhang/exec?command=bash&command=-c&command=wc+-c%3B+echo+oops+%3E%262%3B+exit+3&stdin=true&stdout=true&stderr=true"
		x, err := remotecommand.NewWebSocketExecutor(cfg, "GET", url)
		if err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		err = x.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: strings.NewReader("hello"), Stdout: &out, Stderr: &errOut})
		var exitErr utilexec.ExitError
		if !errors.As(err, &exitErr) || exitErr.ExitStatus() != 3 || out.String() != "5\n" || errOut.String() != "oops\n" {
			t.Fatalf("client-go: %v, stdout %q, stderr %q; want exit 3, 5, oops", err, out.String(), errOut.String())
		}
	})

	t.Run("DescribeSaysTheAgentIsGoneAfterTheTask", func(t *testing.T) {
		if r := stoke(t, env, "", "cancel", "lhang", "--wait"); r.code != 0 {
			t.Fatalf("%s", r)
		}
		r := stoke(t, env, "", "describe", "run", "lhang")
		if r.code != 0 || !regexp.MustCompile(`AgentConnected:\s+False InvocationEnded`).MatchString(r.stdout) {
			t.Fatalf("%s; want AgentConnected False InvocationEnded", r)
		}
	})
}
