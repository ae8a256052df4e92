package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// cliFunction: a Function from the CLI, on both backends: `stoke run
// --scale` creates it and prints its stable URL once MIN replicas are
// Ready; get shows READY/IN-FLIGHT/QUEUED; describe; bad input is one line
// naming the field and creates nothing; apply of a changed template is
// "configured" and of the same one "unchanged"; delete.
func cliFunction(t *testing.T, s *cliServer) {
	ran := stoke(t, s.env(), "", "run", "--runtime", "bash", "--source", "examples/bash-echo", "--handler", "handler.handle", "--name", "hello-fn", "--scale", "2:4")
	if ran.code != 0 || !strings.HasSuffix(strings.TrimSpace(ran.stdout), "/v1/namespaces/default/functions/hello-fn/invoke") {
		t.Fatalf("run --scale: %s", ran)
	}
	if !strings.Contains(ran.stderr, "\n  stoke invoke hello-fn\n") || !strings.Contains(ran.stderr, "2 Ready replicas") {
		t.Errorf("hint: %s", ran.stderr)
	}
	cols := oneRow(t, s.ok(t, "get", "functions", "hello-fn"))
	for col, want := range map[string]string{"NAME": "hello-fn", "RUNTIME": "bash", "READY": "2/2", "IN-FLIGHT": "0", "QUEUED": "0"} {
		if cols[col] != want {
			t.Errorf("get functions: %s is %q, want %q (%v)", col, cols[col], want, cols)
		}
	}
	if out := s.ok(t, "get", "fn"); !strings.Contains(out, "hello-fn") {
		t.Errorf("get fn: %s", out)
	}
	if out := s.ok(t, "describe", "function", "hello-fn"); !strings.Contains(out, "2 desired, 2 ready") || !strings.Contains(out, "stoke invoke hello-fn") {
		t.Errorf("describe: %s", out)
	}
	// The replicas are function Runs with the Function's label.
	if out := s.ok(t, "get", "runs", "-l", "stoke.dev/function=hello-fn", "-o", "name"); strings.Count(out, "run/hello-fn-") != 2 {
		t.Errorf("replica runs: %q", out)
	}

	s.fails(t, 1, "--scale", "run", "--runtime", "bash", "--handler", "handler.handle", "--name", "inverted", "--scale", "3:2")
	s.fails(t, 1, "--name", "run", "--runtime", "bash", "--handler", "handler.handle", "--scale", "0:2")
	dir := t.TempDir()
	manifest := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bad := manifest("bad.yaml", "apiVersion: stoke.dev/v1alpha1\nkind: Function\nmetadata: {name: bad-fn}\nspec: {runtime: bash, handler: handler.handle, scale: {min: 5, max: 2}}\n")
	s.fails(t, 1, "spec.scale", "apply", "-f", bad)
	s.fails(t, 1, "not found", "get", "function", "bad-fn")

	good := "apiVersion: stoke.dev/v1alpha1\nkind: Function\nmetadata: {name: applied-fn}\nspec: {runtime: bash, handler: handler.handle, scale: {min: 0, max: 2}}\n"
	if out := s.ok(t, "apply", "-f", manifest("fn.yaml", good)); !strings.Contains(out, "function/applied-fn created") {
		t.Errorf("apply: %s", out)
	}
	if out := s.ok(t, "apply", "-f", manifest("fn.yaml", good)); !strings.Contains(out, "function/applied-fn unchanged") {
		t.Errorf("apply again: %s", out)
	}
	changed := strings.Replace(good, "handler: handler.handle", "handler: handler.other", 1)
	if out := s.ok(t, "apply", "-f", manifest("fn.yaml", changed)); !strings.Contains(out, "function/applied-fn configured") {
		t.Errorf("apply a change: %s", out)
	}
	if out := s.ok(t, "delete", "function", "applied-fn", "hello-fn"); !strings.Contains(out, "function/applied-fn deleted") || !strings.Contains(out, "function/hello-fn deleted") {
		t.Errorf("delete: %s", out)
	}
	s.fails(t, 1, "not found", "get", "function", "hello-fn")
}

// oneRow reads a table of a header and one row into column → cell.
func oneRow(t *testing.T, out string) map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("want a header and one row, got:\n%s", out)
	}
	head, row := strings.Fields(lines[0]), strings.Fields(lines[1])
	if len(head) != len(row) {
		t.Fatalf("%d columns, %d cells:\n%s", len(head), len(row), out)
	}
	cells := map[string]string{}
	for i, h := range head {
		cells[h] = row[i]
	}
	return cells
}
