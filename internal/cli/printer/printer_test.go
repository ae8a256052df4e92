package printer_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/cli/printer"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

var now = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

func at(ago time.Duration) metav1.Time { return metav1.NewTime(now.Add(-ago)) }

func ptr[T any](v T) *T { return &v }

func runs() []v1alpha1.Run {
	start, done := at(90*time.Second), at(30*time.Second)
	return []v1alpha1.Run{
		{
			ObjectMeta: metav1.ObjectMeta{Name: "task-x7k2p", Namespace: "default", UID: "0b0e", CreationTimestamp: at(2 * time.Minute),
				Labels: map[string]string{"team": "a", "app": "ci"}},
			Spec: v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Entrypoint: "task.sh", Args: []string{"world", "a b"}}},
				Source:      &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "task.sh", Text: "echo hi\n"}},
				Env:         []v1alpha1.EnvVar{{Name: "GREETING", Value: "hi"}},
				Timeout:     &metav1.Duration{Duration: time.Minute},
				RetryPolicy: &v1alpha1.RetryPolicy{MaxAttempts: 3, Backoff: &metav1.Duration{Duration: 2 * time.Second}}, TTLSecondsAfterFinished: ptr(int32(3600))},
			Status: v1alpha1.RunStatus{Phase: v1alpha1.PhaseFailed, Reason: "NonZeroExit", Message: "exit status 3", AssignedPod: "bash-8j1i4", AssignedPodUID: "p-1",
				Attempt: 2, StartTime: &start, CompletionTime: &done, ExitCode: ptr(int32(3)), Outputs: map[string]string{"B": "2", "A": "1"},
				Conditions: []metav1.Condition{{Type: "Scheduled", Status: metav1.ConditionTrue, Reason: "Scheduled", Message: "attempt 2 assigned to pod bash-8j1i4", LastTransitionTime: start}}},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: "prod", UID: "f89a", CreationTimestamp: at(3 * time.Hour), Finalizers: []string{"stoke.dev/runtimed"}},
			Spec: v1alpha1.RunSpec{Runtime: "python", Mode: v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "hello.handle", IdleTimeoutSeconds: 600}},
				Source: &v1alpha1.Source{Archive: &v1alpha1.ArchiveSource{TarGz: []byte{0x1f, 0x8b, 0, 0}}}},
			Status: v1alpha1.RunStatus{Phase: v1alpha1.PhaseReady, AssignedPod: "python-10vs9", AssignedPodUID: "p-2", Attempt: 1, StartTime: &start,
				Endpoint: "http://127.0.0.1:7070/v1/namespaces/prod/runs/hello/f89a/invoke"},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Name: "fresh", Namespace: "default"},
			Spec:       v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"true"}}}},
		},
	}
}

func runtimes() []v1alpha1.Runtime {
	return []v1alpha1.Runtime{{
		ObjectMeta: metav1.ObjectMeta{Name: "python", Namespace: "default", UID: "rt-1", CreationTimestamp: at(26 * time.Hour)},
		Spec:       v1alpha1.RuntimeSpec{Server: "python", Replicas: 2, Runs: 8, DefaultInvokeTimeout: &metav1.Duration{Duration: 30 * time.Second}},
		Status: v1alpha1.RuntimeStatus{ReadyPods: 1, Pods: []v1alpha1.PodStatus{
			{Name: "python-10vs9", UID: "p-2", Ready: true, LastHeartbeat: ptr(at(time.Second))}, {Name: "python-czk7z", UID: "p-3"}}},
	}}
}

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (go test -update rewrites it):\n--- got\n%s--- want\n%s", path, got, want)
	}
}

func clock() time.Time { return now }

func TestTables(t *testing.T) {
	for _, tc := range []struct {
		file   string
		format printer.Format
		allNS  bool
	}{
		{"runs.txt", printer.Table, false},
		{"runs-wide-all.txt", printer.Wide, true},
		{"runs-name.txt", printer.Name, false},
	} {
		t.Run(tc.file, func(t *testing.T) {
			var b bytes.Buffer
			p := printer.New(&b, tc.format, tc.allNS, clock)
			if err := p.Runs(&v1alpha1.RunList{Items: runs()}); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.file, b.Bytes())
		})
	}
	var b bytes.Buffer
	if err := printer.New(&b, printer.Wide, false, clock).Runtimes(&v1alpha1.RuntimeList{Items: runtimes()}); err != nil {
		t.Fatal(err)
	}
	golden(t, "runtimes-wide.txt", b.Bytes())
}

func TestWatchRowsKeepTheirColumns(t *testing.T) {
	var b bytes.Buffer
	p := printer.New(&b, printer.Table, false, clock)
	for _, r := range runs() {
		if err := p.RunEvent(printer.Added, &r); err != nil {
			t.Fatal(err)
		}
	}
	// A deleted Run is not printed as it was last seen (Ready): its
	// phase column says it is gone.
	deleted := runs()[1]
	if err := p.RunEvent(printer.Deleted, &deleted); err != nil {
		t.Fatal(err)
	}
	golden(t, "runs-watch.txt", b.Bytes())
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	col := strings.Index(lines[0], "RUNTIME")
	for _, l := range lines[1:] {
		if l[col-1] != ' ' || l[col] == ' ' {
			t.Errorf("row %q is not aligned with RUNTIME at %d", l, col)
		}
	}
}

func TestObjectsAsJSONAndYAML(t *testing.T) {
	list := &v1alpha1.RunList{Items: runs()}
	var b bytes.Buffer
	if err := printer.New(&b, printer.JSON, false, clock).Runs(list); err != nil {
		t.Fatal(err)
	}
	var back v1alpha1.RunList
	if err := json.Unmarshal(b.Bytes(), &back); err != nil || back.Kind != "RunList" || len(back.Items) != 3 {
		t.Errorf("-o json of a list: %v, kind %q, %d items", err, back.Kind, len(back.Items))
	}

	b.Reset()
	if err := printer.New(&b, printer.JSON, false, clock).Runs(&v1alpha1.RunList{}); err != nil || !strings.Contains(b.String(), `"items": []`) {
		t.Errorf("-o json of an empty list: %v\n%s", err, b.String())
	}

	b.Reset()
	r := runs()[0]
	if err := printer.New(&b, printer.YAML, false, clock).Run(&r); err != nil {
		t.Fatal(err)
	}
	var run v1alpha1.Run
	if err := yaml.UnmarshalStrict(b.Bytes(), &run); err != nil || run.Name != r.Name || *run.Status.ExitCode != 3 {
		t.Errorf("-o yaml of a Run: %v\n%s", err, b.String())
	}

	// A watch writes one JSON object per line, or YAML documents.
	b.Reset()
	p := printer.New(&b, printer.JSON, false, clock)
	rs := runs()
	for i := range rs {
		if err := p.RunEvent(printer.Modified, &rs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(b.String(), "\n"); n != 3 {
		t.Errorf("-o json -w wrote %d lines, want 3", n)
	}
	b.Reset()
	p = printer.New(&b, printer.YAML, false, clock)
	for i := range rs {
		if err := p.RunEvent(printer.Modified, &rs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(b.String(), "---\n"); n != 3 {
		t.Errorf("-o yaml -w wrote %d documents, want 3", n)
	}
}

func TestDescribe(t *testing.T) {
	for i, r := range runs() {
		var b bytes.Buffer
		if err := printer.DescribeRun(&b, &r, now); err != nil {
			t.Fatal(err)
		}
		golden(t, "describe-run-"+string(rune('a'+i))+".txt", b.Bytes())
	}
	var b bytes.Buffer
	rt := runtimes()[0]
	if err := printer.DescribeRuntime(&b, &rt, now); err != nil {
		t.Fatal(err)
	}
	golden(t, "describe-runtime.txt", b.Bytes())
}

func TestParseFormat(t *testing.T) {
	for _, ok := range []string{"", "wide", "json", "yaml", "name"} {
		if _, err := printer.ParseFormat(ok); err != nil {
			t.Errorf("ParseFormat(%q) = %v", ok, err)
		}
	}
	if _, err := printer.ParseFormat("xml"); err == nil || !strings.Contains(err.Error(), "wide, json, yaml, name") {
		t.Errorf("ParseFormat(xml) = %v", err)
	}
}

func TestWatchEventsAreShownOnRequest(t *testing.T) {
	rs := runs()
	var b bytes.Buffer
	p := printer.New(&b, printer.Table, false, clock)
	p.ShowWatchEvents()
	for _, ev := range []string{printer.Added, printer.Deleted} {
		if err := p.RunEvent(ev, &rs[1]); err != nil {
			t.Fatal(err)
		}
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "EVENT ") || !strings.HasPrefix(lines[1], "ADDED ") ||
		!strings.HasPrefix(lines[2], "DELETED ") || !strings.Contains(lines[2], " Ready ") {
		t.Errorf("a table with --output-watch-events:\n%s", b.String())
	}

	b.Reset()
	p = printer.New(&b, printer.JSON, false, clock)
	p.ShowWatchEvents()
	if err := p.RunEvent(printer.Deleted, &rs[1]); err != nil {
		t.Fatal(err)
	}
	var ev struct {
		Type   string
		Object v1alpha1.Run
	}
	if err := json.Unmarshal(b.Bytes(), &ev); err != nil || ev.Type != printer.Deleted || ev.Object.Name != rs[1].Name {
		t.Errorf("-o json --output-watch-events: %v\n%s", err, b.String())
	}
}

// A Run being deleted shows Terminating, as kubectl shows a Pod, whatever
// its phase.
func TestTerminatingRun(t *testing.T) {
	run := runs()[1] // a Ready function
	run.DeletionTimestamp = ptr(at(time.Second))
	var b bytes.Buffer
	if err := printer.New(&b, printer.Table, false, clock).Runs(&v1alpha1.RunList{Items: []v1alpha1.Run{run}}); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(b.String(), "\n"); len(lines) < 2 || !strings.Contains(lines[1], " Terminating ") || strings.Contains(lines[1], "Ready") {
		t.Errorf("a Run being deleted:\n%s", b.String())
	}
}

// A held Run (a created Docker container) shows Held until it is
// released; a released one its phase.
func TestHeldRun(t *testing.T) {
	run := runs()[0]
	run.Spec.Held, run.Status = true, v1alpha1.RunStatus{}
	released := *run.DeepCopy()
	released.Name, released.Spec.Held = "released", false
	var b bytes.Buffer
	if err := printer.New(&b, printer.Table, false, clock).Runs(&v1alpha1.RunList{Items: []v1alpha1.Run{run, released}}); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(b.String(), "\n"); len(lines) < 3 || !strings.Contains(lines[1], " Held ") || !strings.Contains(lines[2], " Pending ") {
		t.Errorf("a held Run and a released one:\n%s", b.String())
	}
}
