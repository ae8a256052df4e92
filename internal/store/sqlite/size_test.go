package sqlite_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/validation"
)

// largestRun is a legal Run whose JSON without status is exactly
// bounds.ObjectJSON: inline source and arguments at their bounds, and an
// env value taking the rest.
func largestRun(t testing.TB) *v1alpha1.Run {
	t.Helper()
	args := make([]string, bounds.Args)
	for i := range args {
		args[i] = strings.Repeat("a", bounds.Arg)
	}
	run := &v1alpha1.Run{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.KindRun},
		ObjectMeta: metav1.ObjectMeta{Name: "largest", Namespace: "default"},
		Spec: v1alpha1.RunSpec{Runtime: "bash",
			Mode:   v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: args}},
			Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "main.sh", Text: strings.Repeat("s", bounds.Source)}},
			Env:    []v1alpha1.EnvVar{{Name: "FILL", Value: ""}},
		},
	}
	size := func() int {
		b, err := json.Marshal(run)
		if err != nil {
			t.Fatal(err)
		}
		return len(b)
	}
	run.Spec.Env[0].Value = strings.Repeat("e", bounds.ObjectJSON-size())
	if got := size(); got != bounds.ObjectJSON {
		t.Fatalf("largest Run is %d bytes, want %d", got, bounds.ObjectJSON)
	}
	if err := validation.ValidateRun(run); err != nil {
		t.Fatalf("the largest Run is not legal: %v", err)
	}
	return run
}

// worstStatus is a status with every bounded field at its bound, of
// characters JSON escapes to six bytes.
func worstStatus() v1alpha1.RunStatus {
	now := metav1.NewTime(time.Now())
	st := v1alpha1.RunStatus{Phase: v1alpha1.PhaseSucceeded, Reason: "Completed",
		Message: strings.Repeat("<", bounds.Message), Attempt: bounds.RetryAttempts,
		StartTime: &now, CompletionTime: &now, Outputs: map[string]string{}}
	per := bounds.OutputsTotal / bounds.OutputKeys
	for i := range bounds.OutputKeys {
		key := fmt.Sprintf("K%03d", i)
		st.Outputs[key] = strings.Repeat("<", min(per-len(key), bounds.OutputValue))
	}
	for _, typ := range []string{"Scheduled", "Ready", "Succeeded"} {
		st.Conditions = append(st.Conditions, metav1.Condition{Type: typ, Status: metav1.ConditionTrue,
			Reason: "Because", Message: strings.Repeat("<", bounds.Message), LastTransitionTime: now})
	}
	return st
}

// What the API takes, the store keeps: the largest legal Run is created,
// and its worst status written.
func TestLargestLegalRunIsStorable(t *testing.T) {
	ctx := context.Background()
	s := open(t, t.TempDir())
	run := largestRun(t)
	created, err := s.Runs().Create(ctx, run)
	if err != nil {
		t.Fatalf("create the largest legal Run: %v", err)
	}
	created.Status = worstStatus()
	if _, err := s.Runs().UpdateStatus(ctx, created); err != nil {
		t.Fatalf("its status at every bound: %v", err)
	}
	got, err := s.Runs().Get(ctx, "default", "largest")
	if err != nil || got.Spec.Env[0].Value != run.Spec.Env[0].Value || len(got.Status.Outputs) != bounds.OutputKeys {
		t.Fatalf("read back: %v", err)
	}
	// One byte more is refused by validation, before the store.
	run.Spec.Env[0].Value += "e"
	if err := validation.ValidateRun(run); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Fatalf("a Run one byte over: %v, want ErrTooLarge", err)
	}
}

// Fields within their own bounds can still escape to more JSON than that:
// validation counts the encoded object, as the store does.
func TestEscapedRunIsTooLarge(t *testing.T) {
	args := make([]string, bounds.Args)
	for i := range args {
		args[i] = strings.Repeat("<", bounds.Arg) // 8 KiB, 48 KiB of JSON
	}
	run := &v1alpha1.Run{ObjectMeta: metav1.ObjectMeta{Name: "escaped", Namespace: "default"},
		Spec: v1alpha1.RunSpec{Runtime: "bash", Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: args}}}}
	if err := validation.ValidateRun(run); !errors.Is(err, errdefs.ErrTooLarge) || !strings.Contains(err.Error(), "at most") {
		t.Fatalf("validate: %v, want ErrTooLarge", err)
	}
}
