package runtimed_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"path/filepath"
	"strings"
	"testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// tarGz packs regular files, in order, as a source archive.
func tarGz(t *testing.T, files ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, name := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: 2, Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte("x\n")); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// A Run's status never shows the server's own paths — its working
// directory, the pod's workspace, the pod's socket — whatever failed: a
// source that names the working directory itself (the store here takes
// what validation would refuse), an archive whose files cannot be written,
// an entrypoint that is not there.
func TestStatusHoldsNoServerPath(t *testing.T) {
	e := newEnv(t, "bash")
	dot := taskRun("dot", "true")
	dot.Spec.Source.Inline.Path = "."
	clash := taskRun("clash", "true")
	clash.Spec.Mode.Task.Entrypoint = "a"
	clash.Spec.Source = &v1alpha1.Source{Archive: &v1alpha1.ArchiveSource{TarGz: tarGz(t, "a", "a/b")}}
	missing := taskRun("missing", "true")
	missing.Spec.Mode.Task.Entrypoint = "missing.sh"
	for _, run := range []*v1alpha1.Run{dot, clash, missing} {
		e.submit(run)
	}
	serverDir := filepath.Dir(e.pod.WorkspaceRoot)
	for _, name := range []string{"dot", "clash", "missing"} {
		run := e.waitPhase(name, v1alpha1.PhaseFailed, v1alpha1.PhaseSucceeded)
		t.Logf("%s: %s: %s", name, run.Status.Reason, run.Status.Message)
		if run.Status.Phase != v1alpha1.PhaseFailed || run.Status.Message == "" {
			t.Errorf("%s: %s %q, want Failed with a message", name, run.Status.Phase, run.Status.Message)
		}
		texts := []string{run.Status.Message}
		for _, c := range run.Status.Conditions {
			texts = append(texts, c.Message)
		}
		for _, text := range texts {
			if strings.Contains(text, serverDir) {
				t.Errorf("%s: the status names a server path: %q", name, text)
			}
		}
	}
}

// A source archive entry that names a path outside the Run's directory
// fails the Run, saying so, and writes nothing there (it was once
// silently confined: "../x" became "x").
func TestSourceArchiveRefusesEscapes(t *testing.T) {
	e := newEnv(t, "bash")
	run := taskRun("escape", "true")
	run.Spec.Mode.Task.Entrypoint = "a"
	run.Spec.Source = &v1alpha1.Source{Archive: &v1alpha1.ArchiveSource{TarGz: tarGz(t, "a", "../escaped")}}
	e.submit(run)
	got := e.waitPhase("escape", v1alpha1.PhaseFailed, v1alpha1.PhaseSucceeded)
	if got.Status.Phase != v1alpha1.PhaseFailed || !strings.Contains(got.Status.Message, "names outside the destination") {
		t.Errorf("%s %q, want Failed naming the escape", got.Status.Phase, got.Status.Message)
	}
	matches, _ := filepath.Glob(filepath.Join(filepath.Dir(e.pod.WorkspaceRoot), "**", "escaped"))
	more, _ := filepath.Glob(filepath.Join(filepath.Dir(e.pod.WorkspaceRoot), "escaped"))
	if len(matches)+len(more) != 0 {
		t.Errorf("written outside: %v %v", matches, more)
	}
}
