package printer

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// describer writes "Key:  value" lines with the values aligned.
type describer struct {
	lines [][3]string // indent, key, value
	now   time.Time
	// summaries are step Runs' summaries, by name (a WorkflowRun's).
	summaries map[string]string
}

func (d *describer) add(indent int, key, value string) {
	d.lines = append(d.lines, [3]string{strings.Repeat("  ", indent), key, value})
}

func (d *describer) time(indent int, key string, t *metav1.Time) {
	if t == nil || t.IsZero() {
		return
	}
	d.add(indent, key, fmt.Sprintf("%s (%s ago)", t.UTC().Format(time.RFC3339), duration.HumanDuration(d.now.Sub(t.Time))))
}

func (d *describer) write(w io.Writer) error {
	width := 0
	for _, l := range d.lines {
		if l[2] != "" {
			width = max(width, len(l[0])+len(l[1]))
		}
	}
	var b strings.Builder
	for _, l := range d.lines {
		b.WriteString(l[0])
		b.WriteString(l[1])
		if l[2] != "" {
			b.WriteString(strings.Repeat(" ", width-len(l[0])-len(l[1])+2))
			// A multi-line value (a message) stays under its column.
			b.WriteString(strings.ReplaceAll(l[2], "\n", "\n"+strings.Repeat(" ", width+2)))
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// DescribeRun writes a Run for people: metadata, spec, status, outputs and
// conditions.
func DescribeRun(w io.Writer, run *v1alpha1.Run, now time.Time) error {
	d := &describer{now: now}
	describeMeta(d, &run.ObjectMeta)
	s := &run.Spec
	d.add(0, "Runtime:", s.Runtime)
	switch {
	case s.Mode.Task != nil:
		d.add(0, "Mode:", "task")
		if t := s.Mode.Task; t.Entrypoint != "" {
			d.add(1, "Entrypoint:", t.Entrypoint)
		}
		if len(s.Mode.Task.Args) > 0 {
			d.add(1, "Args:", quoteArgs(s.Mode.Task.Args))
		}
	case s.Mode.Function != nil:
		f := s.Mode.Function
		d.add(0, "Mode:", "function")
		d.add(1, "Handler:", f.Handler)
		if f.IdleTimeoutSeconds > 0 {
			d.add(1, "Idle timeout:", (time.Duration(f.IdleTimeoutSeconds) * time.Second).String())
		}
	}
	switch src := s.Source; {
	case src == nil:
		d.add(0, "Source:", "none")
	case src.Inline != nil:
		d.add(0, "Source:", fmt.Sprintf("inline %s (%d bytes)", src.Inline.Path, len(src.Inline.Text)))
	case src.Archive != nil:
		d.add(0, "Source:", fmt.Sprintf("archive (%d bytes, tar.gz)", len(src.Archive.TarGz)))
	}
	if len(s.Env) > 0 {
		d.add(0, "Env:", "")
		for _, e := range s.Env {
			d.add(1, e.Name+"="+e.Value, "")
		}
	}
	if s.Timeout != nil {
		d.add(0, "Timeout:", s.Timeout.Duration.String())
	}
	if rp := s.RetryPolicy; rp != nil {
		v := fmt.Sprintf("maxAttempts %d", max(rp.MaxAttempts, 1))
		if rp.Backoff != nil {
			v += ", backoff " + rp.Backoff.Duration.String()
		}
		if len(rp.RetryableReasons) > 0 {
			v += ", retryable " + strings.Join(rp.RetryableReasons, ",")
		}
		d.add(0, "Retry policy:", v)
	}
	if s.TTLSecondsAfterFinished != nil {
		d.add(0, "TTL after finished:", (time.Duration(*s.TTLSecondsAfterFinished) * time.Second).String())
	}
	if s.CancelRequested {
		d.add(0, "Cancel requested:", "true")
	}

	st := &run.Status
	d.add(0, "Status:", "")
	d.add(1, "Phase:", string(PhaseOf(run)))
	if st.Reason != "" {
		d.add(1, "Reason:", st.Reason)
	}
	if st.Message != "" {
		d.add(1, "Message:", st.Message)
	}
	if st.Attempt > 0 {
		d.add(1, "Attempt:", fmt.Sprint(st.Attempt))
	}
	if st.AssignedPod != "" {
		d.add(1, "Pod:", fmt.Sprintf("%s (uid %s)", st.AssignedPod, st.AssignedPodUID))
	}
	d.time(1, "Started:", st.StartTime)
	d.time(1, "Completed:", st.CompletionTime)
	if st.StartTime != nil && st.CompletionTime != nil {
		d.add(1, "Duration:", st.CompletionTime.Sub(st.StartTime.Time).String())
	}
	if st.ExitCode != nil {
		d.add(1, "Exit code:", fmt.Sprint(*st.ExitCode))
	}
	if st.Endpoint != "" {
		d.add(1, "Endpoint:", st.Endpoint)
	}
	if len(st.Outputs) > 0 {
		d.add(0, "Outputs:", "")
		for _, k := range slices.Sorted(maps.Keys(st.Outputs)) {
			d.add(1, k+"="+st.Outputs[k], "")
		}
	}
	describeConditions(d, st.Conditions)
	return d.write(w)
}

// DescribeRuntime writes a Runtime for people.
func DescribeRuntime(w io.Writer, rt *v1alpha1.Runtime, now time.Time) error {
	d := &describer{now: now}
	describeMeta(d, &rt.ObjectMeta)
	s := &rt.Spec
	d.add(0, "Server:", s.Server)
	d.add(0, "Replicas:", fmt.Sprint(s.Replicas))
	d.add(0, "Runs per pod:", fmt.Sprint(s.Runs))
	for _, t := range []struct {
		key string
		d   *metav1.Duration
	}{{"Default task timeout:", s.DefaultTaskTimeout}, {"Default function timeout:", s.DefaultFunctionTimeout}, {"Default invoke timeout:", s.DefaultInvokeTimeout}} {
		if t.d != nil {
			d.add(0, t.key, t.d.Duration.String())
		}
	}
	d.add(0, "Ready pods:", fmt.Sprintf("%d/%d", rt.Status.ReadyPods, s.Replicas))
	if len(rt.Status.Pods) > 0 {
		d.add(0, "Pods:", "")
		for _, p := range rt.Status.Pods {
			v := "not ready"
			if p.Ready {
				v = "ready"
			}
			if p.LastHeartbeat != nil {
				v += ", heartbeat " + duration.HumanDuration(now.Sub(p.LastHeartbeat.Time)) + " ago"
			}
			d.add(1, p.Name+":", fmt.Sprintf("%s (uid %s)", v, p.UID))
		}
	}
	describeConditions(d, rt.Status.Conditions)
	return d.write(w)
}

func describeMeta(d *describer, m *metav1.ObjectMeta) {
	d.add(0, "Name:", m.Name)
	d.add(0, "Namespace:", m.Namespace)
	if m.UID != "" {
		d.add(0, "UID:", string(m.UID))
	}
	if len(m.Labels) > 0 {
		var ls []string
		for _, k := range slices.Sorted(maps.Keys(m.Labels)) {
			ls = append(ls, k+"="+m.Labels[k])
		}
		d.add(0, "Labels:", strings.Join(ls, ","))
	}
	d.time(0, "Created:", &m.CreationTimestamp)
	d.time(0, "Deleting since:", m.DeletionTimestamp)
	if len(m.Finalizers) > 0 {
		d.add(0, "Finalizers:", strings.Join(m.Finalizers, ","))
	}
}

func describeConditions(d *describer, conds []metav1.Condition) {
	if len(conds) == 0 {
		return
	}
	d.add(0, "Conditions:", "")
	for _, c := range conds {
		v := string(c.Status)
		if c.Reason != "" {
			v += " " + c.Reason
		}
		if !c.LastTransitionTime.IsZero() {
			v += " (" + duration.HumanDuration(d.now.Sub(c.LastTransitionTime.Time)) + " ago)"
		}
		if c.Message != "" {
			v += ": " + c.Message
		}
		d.add(1, c.Type+":", v)
	}
}

func quoteArgs(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = fmt.Sprintf("%q", a)
	}
	return strings.Join(q, " ")
}
