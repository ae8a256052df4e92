package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDockerOnLambda drives Lambda-backed containers with Debian's Docker
// CLI: an image the images table maps to a lambda Runtime runs as a task
// Run in a Lambda sandbox (the simulator with the real RIE), and `docker
// run`, `logs`, `wait`, `exec` and `cp` reach it there, exec and cp
// through the reverse agent. What Lambda cannot do (signals but SIGKILL,
// top) is refused with a message that says so.
func TestDockerOnLambda(t *testing.T) {
	startLambda(t, 20)
	images := filepath.Join(t.TempDir(), "images.yaml")
	if err := os.WriteFile(images, []byte("images:\n- image: \"lambda-bash:*\"\n  runtime: lambda-bash\n  cmd: [bash]\n- image: \"bash:*\"\n  runtime: bash\n  cmd: [bash]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	up := startUp(t, t.TempDir(), "--docker-images", images)
	launcher := filepath.Join(t.TempDir(), "launcher")
	if err := os.WriteFile(launcher, []byte("#!/usr/bin/env bash\nexec -a bootstrap "+stokeBin+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	up.applyLambdaRuntime(t, "lambda-bash", "bash", launcher)
	d := dockerCLI{t: t, bin: dockerCLIs(t)[0], host: "unix://" + dockerSocket(up.DataDir)}

	t.Run("RunRm", func(t *testing.T) {
		d.t = t
		// The sandbox's own environment: the command ran in Lambda.
		out, errOut, code := d.run("", "run", "--rm", "lambda-bash", "sh", "-c", `echo "fn=${AWS_LAMBDA_FUNCTION_NAME:+set}"; echo err >&2; exit 3`)
		if out != "fn=set\n" || !strings.Contains(errOut, "err\n") || code != 3 {
			t.Errorf("got stdout %q stderr %q exit %d, want fn=set, err and 3", out, errOut, code)
		}
		if left := d.ok("ps", "-aq"); left != "" {
			t.Errorf("containers left after run --rm: %q", left)
		}
	})
	t.Run("DetachedLogsWait", func(t *testing.T) {
		d.t = t
		id := strings.TrimSpace(d.ok("run", "-d", "--name", "lwait", "lambda-bash", "sh", "-c", "for i in 0 1 2; do echo $i; done; exit 4"))
		if out := d.ok("logs", "-f", id); out != "0\n1\n2\n" {
			t.Errorf("logs -f: %q", out)
		}
		if out := d.ok("wait", id); out != "4\n" {
			t.Errorf("wait: %q, want 4", out)
		}
		if run := up.getRun(t, "lwait"); run.Spec.Runtime != "lambda-bash" {
			t.Errorf("its Run's Runtime: %s, want lambda-bash", run.Spec.Runtime)
		}
		d.ok("rm", id)
	})
	t.Run("ExecAndCopy", func(t *testing.T) {
		d.t = t
		// The answer comes once the task runs; its output comes at its
		// end (a Lambda task's log is its invocation's answer).
		id := strings.TrimSpace(d.ok("run", "-d", "lambda-bash", "sleep", "600"))
		defer d.ok("rm", "-f", id)
		// The exec runs in the sandbox, where the task runs: the reverse
		// agent, not the Runtime Server's machine (the first exec may wait
		// for the agent to dial back).
		out, _, code := d.run("one\ntwo\n", "exec", "-i", id, "sh", "-c", `cat; echo "root=${LAMBDA_TASK_ROOT:+set}"`)
		if out != "one\ntwo\nroot=set\n" || code != 0 {
			t.Errorf("exec -i: %q exit %d", out, code)
		}
		if _, _, code := d.run("", "exec", id, "sh", "-c", "exit 7"); code != 7 {
			t.Errorf("exec exit: %d, want 7", code)
		}
		testExecTTY(t, d, id)
		testCopy(t, d, id)
	})
	t.Run("RefusedWhereLambdaCannot", func(t *testing.T) {
		d.t = t
		id := strings.TrimSpace(d.ok("run", "-d", "lambda-bash", "sleep", "600"))
		for _, args := range [][]string{{"kill", "-s", "USR1", id}, {"top", id}} {
			if _, errOut, code := d.run("", args...); code == 0 || !strings.Contains(errOut, "Lambda") {
				t.Errorf("docker %s: exit %d, stderr %q; want a refusal naming Lambda", strings.Join(args, " "), code, errOut)
			}
		}
		// A task on Lambda has no terminal or stdin to attach (its
		// process is in the sandbox): -t and -i are refused at create.
		for i, flag := range []string{"-t", "-i"} {
			name := fmt.Sprintf("lambda-interactive-%d", i)
			_, errOut, code := d.run("", "run", flag, "--name", name, "lambda-bash", "true")
			if code == 0 || !strings.Contains(errOut, "Lambda") || !strings.Contains(errOut, "-t, -i") {
				t.Errorf("docker run %s on Lambda: exit %d, stderr %q; want a refusal naming Lambda and -t, -i", flag, code, errOut)
			}
			d.run("", "rm", "-f", name)
		}
		// SIGKILL is what Lambda can do: the Run is cancelled, which ends
		// the invocation; the task's relay on the Runtime Server's side
		// ends as SIGTERM ends a program (143).
		d.ok("kill", id)
		if out := d.ok("wait", id); out != "143\n" {
			t.Errorf("wait after kill: %q, want 143", out)
		}
		d.ok("rm", id)
	})
}
