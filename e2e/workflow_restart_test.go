package e2e

import (
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// getWorkflowRun reads a WorkflowRun through the HTTP API.
func (u *stokeUp) getWorkflowRun(t *testing.T, name string) *v1alpha1.WorkflowRun {
	t.Helper()
	status, body := u.do(t, http.MethodGet, "/v1/namespaces/default/workflowruns/"+name, nil)
	if status != http.StatusOK {
		t.Fatalf("get workflowrun %s: %d %s", name, status, body)
	}
	var wf v1alpha1.WorkflowRun
	if err := json.Unmarshal(body, &wf); err != nil {
		t.Fatal(err)
	}
	return &wf
}

// awaitWorkflowRun polls the WorkflowRun until cond holds (a minute).
func (u *stokeUp) awaitWorkflowRun(t *testing.T, name, what string, cond func(*v1alpha1.WorkflowRun) bool) *v1alpha1.WorkflowRun {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		wf := u.getWorkflowRun(t, name)
		if cond(wf) {
			return wf
		}
		if time.Now().After(deadline) {
			b, _ := json.MarshalIndent(wf.Status, "", " ")
			t.Fatalf("waited a minute for %s: %s", what, b)
		}
		time.Sleep(50 * time.Millisecond) // the status has no watch here; poll
	}
}

func lines(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

// A kill -9 of stoke up mid-workflow, then a restart: the job that
// finished is not run again; the job whose step was running lost its pod
// and is retried whole, by its retry policy, and the WorkflowRun succeeds.
func TestWorkflowSurvivesKill9(t *testing.T) {
	dir := t.TempDir()
	u := startUp(t, dir)
	marks := runsCanWrite(t)
	gate := runsCanOpenFIFO(t, "gate")
	env := []v1alpha1.EnvVar{{Name: "MARKS", Value: marks}, {Name: "GATE", Value: gate}}
	wf := &v1alpha1.WorkflowRun{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindWorkflowRun},
		ObjectMeta: metav1.ObjectMeta{Name: "restart"},
		Spec: v1alpha1.WorkflowRunSpec{Env: env, Jobs: []v1alpha1.Job{
			{ID: "first", RunsOn: "bash", Steps: []v1alpha1.Step{{Run: `echo ran >> "$MARKS/first"`}}},
			{ID: "second", Needs: []string{"first"}, RunsOn: "bash",
				RetryPolicy: &v1alpha1.RetryPolicy{MaxAttempts: 2, Backoff: &metav1.Duration{}},
				Steps: []v1alpha1.Step{
					{Run: `echo "attempt" >> "$MARKS/second"`},
					{ID: "wait", Run: `read -r _ < "$GATE"; echo through`},
				}},
		}},
	}
	if status, body := u.do(t, http.MethodPost, "/v1/namespaces/default/workflowruns", wf); status != http.StatusCreated {
		t.Fatalf("create: %d %s", status, body)
	}
	u.awaitWorkflowRun(t, "restart", "second's wait step running", func(wf *v1alpha1.WorkflowRun) bool {
		for _, j := range wf.Status.Jobs {
			if j.Name == "second" && len(j.Steps) == 2 && j.Steps[1].Phase == v1alpha1.JobRunning {
				return true
			}
		}
		return false
	})

	u.kill9(t)
	if left := awaitNoProcessesUnder(dir, 10*time.Second); len(left) > 0 {
		t.Fatalf("after the kill:\n%s", describeProcesses(left))
	}
	addr, err := url.Parse(u.URL)
	if err != nil {
		t.Fatal(err)
	}
	u2 := startUp(t, dir, "--listen", addr.Host)
	// The retried attempt's wait step reads the gate.
	openGate(t, gate)
	done := u2.awaitWorkflowRun(t, "restart", "the WorkflowRun to end", func(wf *v1alpha1.WorkflowRun) bool { return wf.Status.Phase.Terminal() })
	if done.Status.Phase != v1alpha1.WorkflowSucceeded {
		t.Fatalf("phase %s: %s", done.Status.Phase, done.Status.Message)
	}
	for _, j := range done.Status.Jobs {
		want := map[string]int32{"first": 1, "second": 2}[j.Name]
		if j.Attempt != want {
			t.Errorf("job %s: attempt %d, want %d", j.Name, j.Attempt, want)
		}
	}
	if n := lines(t, filepath.Join(marks, "first")); n != 1 {
		t.Errorf("first ran %d times, want once", n)
	}
	if n := lines(t, filepath.Join(marks, "second")); n != 2 {
		t.Errorf("second's first step ran %d times, want twice (the job retried whole)", n)
	}
	u2.stop(t)
}
