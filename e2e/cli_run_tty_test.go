package e2e

import (
	"strings"
	"testing"
)

// cliRunInteractive: stoke run -i and -t as docker run -i and -t. With
// -i the task reads the CLI's stdin to its EOF, its stdout and stderr
// apart; with -it under a pseudo-terminal a typed command runs on the
// task's terminal, `stty size` follows a resize of the outer one, and
// `exit 3` is the CLI's status; --rm leaves no Run. On a cluster the
// session goes through the API server to the gateway, as stoke exec's.
func cliRunInteractive(t *testing.T, s *cliServer) {
	if !s.standalone() && !s.dataplane {
		t.Log("no gateway on this cluster: no attach")
		return
	}
	if r := stoke(t, s.env(), "hi\n", "run", "-i", "--rm", "--runtime", "bash", "--", "cat"); r.code != 0 || r.stdout != "hi\n" {
		t.Errorf("echo hi | stoke run -i --rm --runtime bash -- cat: %s", r)
	}
	r := stoke(t, s.env(), "one\ntwo\n", "run", "-i", "--name", "run-i", "--runtime", "bash", "--", "sh", "-c", "wc -l; echo err >&2; exit 4")
	if strings.TrimSpace(r.stdout) != "2" || !strings.Contains(r.stderr, "err\n") || r.code != 4 {
		t.Errorf("stoke run -i, stdout and stderr: %s; want 2, err, exit 4", r)
	}
	if run := s.getRun(t, "run-i"); !run.Spec.Mode.Task.Stdin || run.Spec.Mode.Task.TTY {
		t.Errorf("stoke run -i: the Run's task has stdin %v, tty %v; want true, false", run.Spec.Mode.Task.Stdin, run.Spec.Mode.Task.TTY)
	}
	s.ok(t, "delete", "--wait", "run-i")

	cmd := cliCommand(t.Context(), s.env(), "run", "-it", "--rm", "--name", "run-it", "--runtime", "bash", "--", "bash", "--norc", "--noprofile")
	startTerm(t, cmd, 33, 91).shellSession("stoke run -it")
	if out := s.ok(t, "get", "runs", "-o", "name"); strings.Contains(out, "run-it") {
		t.Errorf("stoke run -it --rm left its Run: %q", out)
	}
}
