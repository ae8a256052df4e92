package workflow

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// BenchmarkStartsSteps20 is the status comparison every decision makes
// (starts), on the status of BenchmarkUpWorkflowSteps20's job half way:
// 20 steps, 10 ended, one just gone Running.
func BenchmarkStartsSteps20(b *testing.B) {
	tm := metav1.NewTime(t0)
	code := int32(0)
	js := v1alpha1.JobStatus{Name: "j", Job: "j", Phase: v1alpha1.JobRunning, StartTime: &tm, Pod: "p", PodUID: "p-uid"}
	for i := range 20 {
		ss := v1alpha1.StepStatus{Name: "Run true", Phase: v1alpha1.JobPending}
		if i <= 10 {
			ss.Run, ss.StartTime = fmt.Sprintf("steps-j-%d", i), &tm
			ss.Phase = v1alpha1.JobRunning
		}
		if i < 10 {
			ss.Phase, ss.Outcome, ss.Conclusion, ss.ExitCode, ss.CompletionTime = v1alpha1.JobSucceeded, resultSuccess, resultSuccess, &code, &tm
		}
		js.Steps = append(js.Steps, ss)
	}
	stored := &v1alpha1.WorkflowRunStatus{Phase: v1alpha1.WorkflowRunning, StartTime: &tm, ObservedGeneration: 1, Jobs: []v1alpha1.JobStatus{js}}
	same := stored.DeepCopy()
	started := stored.DeepCopy()
	started.Jobs[0].Steps[10].Phase = v1alpha1.JobRunning
	stored.Jobs[0].Steps[10].Phase = v1alpha1.JobPending
	same.Jobs[0].Steps[10].Phase = v1alpha1.JobPending
	for _, c := range []struct {
		name string
		next *v1alpha1.WorkflowRunStatus
		want change
	}{{"nothing", same, nothing}, {"onlyStarts", started, onlyStarts}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if got := starts(stored, c.next); got != c.want {
					b.Fatalf("starts: %v, want %v", got, c.want)
				}
			}
		})
	}
}
