package printer

import (
	"fmt"
	"io"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// WorkflowRuns prints a list of WorkflowRuns.
func (p *Printer) WorkflowRuns(list *v1alpha1.WorkflowRunList) error {
	switch p.format {
	case JSON, YAML:
		c := *list
		if c.Kind == "" {
			c.APIVersion, c.Kind = v1alpha1.GroupVersion.String(), "WorkflowRunList"
		}
		if c.Items == nil {
			c.Items = []v1alpha1.WorkflowRun{}
		}
		return p.object(&c)
	}
	rows := make([][]string, 0, len(list.Items))
	for i := range list.Items {
		rows = append(rows, p.workflowRunRow(&list.Items[i]))
	}
	return p.table(p.workflowRunHeader(), rows, len(list.Items) == 0)
}

// WorkflowRun prints one WorkflowRun.
func (p *Printer) WorkflowRun(w *v1alpha1.WorkflowRun) error {
	switch p.format {
	case JSON, YAML:
		return p.object(w)
	}
	return p.table(p.workflowRunHeader(), [][]string{p.workflowRunRow(w)}, false)
}

// WorkflowRunEvent prints one WorkflowRun of a watch.
func (p *Printer) WorkflowRunEvent(event string, w *v1alpha1.WorkflowRun) error {
	return p.event(event, w, p.workflowRunHeader, func() []string { return p.workflowRunRow(w) })
}

// The columns of `kubectl get workflowruns` (the CRD's), and JOBS: how
// many job instances have ended of how many.
func (p *Printer) workflowRunHeader() []string {
	h := []string{"NAME", "WORKFLOW", "PHASE", "JOBS", "AGE"}
	if p.format == Wide {
		h = append(h, "REASON", "DURATION")
	}
	return p.namespaced(h, "NAMESPACE")
}

func (p *Printer) workflowRunRow(w *v1alpha1.WorkflowRun) []string {
	if p.format == Name {
		return []string{"workflowrun/" + w.Name}
	}
	s := &w.Status
	ended := 0
	for _, j := range s.Jobs {
		if j.Phase.Terminal() {
			ended++
		}
	}
	jobs := "-"
	if len(s.Jobs) > 0 {
		jobs = fmt.Sprintf("%d/%d", ended, len(s.Jobs))
	}
	r := []string{w.Name, dash(w.Spec.Workflow), dash(string(s.Phase)), jobs, p.age(w.CreationTimestamp.Time)}
	if p.format == Wide {
		r = append(r, dash(s.Reason), spanOf(s.StartTime, s.CompletionTime))
	}
	return p.namespaced(r, w.Namespace)
}

// Workflows prints a list of Workflows.
func (p *Printer) Workflows(list *v1alpha1.WorkflowList) error {
	switch p.format {
	case JSON, YAML:
		c := *list
		if c.Kind == "" {
			c.APIVersion, c.Kind = v1alpha1.GroupVersion.String(), "WorkflowList"
		}
		if c.Items == nil {
			c.Items = []v1alpha1.Workflow{}
		}
		return p.object(&c)
	}
	rows := make([][]string, 0, len(list.Items))
	for i := range list.Items {
		rows = append(rows, p.workflowRow(&list.Items[i]))
	}
	return p.table(p.workflowHeader(), rows, len(list.Items) == 0)
}

// Workflow prints one Workflow.
func (p *Printer) Workflow(w *v1alpha1.Workflow) error {
	switch p.format {
	case JSON, YAML:
		return p.object(w)
	}
	return p.table(p.workflowHeader(), [][]string{p.workflowRow(w)}, false)
}

// WorkflowEvent prints one Workflow of a watch.
func (p *Printer) WorkflowEvent(event string, w *v1alpha1.Workflow) error {
	return p.event(event, w, p.workflowHeader, func() []string { return p.workflowRow(w) })
}

func (p *Printer) workflowHeader() []string {
	return p.namespaced([]string{"NAME", "JOBS", "INPUTS", "AGE"}, "NAMESPACE")
}

func (p *Printer) workflowRow(w *v1alpha1.Workflow) []string {
	if p.format == Name {
		return []string{"workflow/" + w.Name}
	}
	inputs := make([]string, len(w.Spec.Inputs))
	for i, in := range w.Spec.Inputs {
		inputs[i] = in.Name
	}
	return p.namespaced([]string{w.Name, fmt.Sprint(len(w.Spec.Jobs)), dash(strings.Join(inputs, ",")), p.age(w.CreationTimestamp.Time)}, w.Namespace)
}

// spanOf is how long from start to end ("-" before the start; until now
// while running is not shown: the table is a snapshot).
func spanOf(start, end *metav1.Time) string {
	if start == nil || end == nil || start.IsZero() || end.IsZero() {
		return "-"
	}
	return end.Sub(start.Time).Round(time.Millisecond).String()
}

// DescribeWorkflowRun writes a WorkflowRun for people: its metadata, its
// phase, and the DAG: each job instance in the spec's order with what it
// needs and its phase, attempt and pod, and under it each step's phase,
// exit code and duration, and its step summary ($GITHUB_STEP_SUMMARY)
// from summaries, by step Run name.
func DescribeWorkflowRun(w io.Writer, wf *v1alpha1.WorkflowRun, summaries map[string]string, now time.Time) error {
	d := &describer{now: now, summaries: summaries}
	describeMeta(d, &wf.ObjectMeta)
	if wf.Spec.Workflow != "" {
		d.add(0, "Workflow:", wf.Spec.Workflow)
	}
	if src := wf.Spec.Source; src != nil {
		d.add(0, "Source:", strings.TrimSpace(src.URL+" "+src.Commit+src.Ref))
	}
	if wf.Spec.CancelRequested {
		d.add(0, "Cancel Requested:", "true")
	}
	st := &wf.Status
	d.add(0, "Phase:", dash(string(st.Phase)))
	if st.Reason != "" {
		d.add(0, "Reason:", st.Reason)
	}
	if st.Message != "" {
		d.add(0, "Message:", st.Message)
	}
	d.time(0, "Started:", st.StartTime)
	d.time(0, "Completed:", st.CompletionTime)
	jobs := wf.Spec.Jobs
	called := map[string][]v1alpha1.Job{}
	if sn := st.Snapshot; sn != nil {
		if sn.Spec != nil {
			jobs = sn.Spec.Jobs
		}
		for _, c := range sn.Called {
			called[c.Name] = c.Spec.Jobs
		}
	}
	d.add(0, "Jobs:", "")
	describeJobs(d, st, jobs, called, "", 1, 0)
	for _, o := range st.Outputs {
		d.add(0, "Output "+o.Name+":", o.Value)
	}
	return d.write(w)
}

// describeJobs writes jobs (a Workflow's, under prefix: "" for the run's
// own, "call/" for those a job named call calls) at indent, each called
// Workflow's jobs under the job that calls it, with their full name
// (call/build) and the Workflow they are of.
func describeJobs(d *describer, st *v1alpha1.WorkflowRunStatus, jobs []v1alpha1.Job, called map[string][]v1alpha1.Job, prefix string, indent, depth int) {
	for _, j := range jobs {
		id := prefix + j.ID
		instances := jobInstances(st.Jobs, id)
		needs := ""
		if len(j.Needs) > 0 {
			needs = "needs " + strings.Join(j.Needs, ", ")
		}
		if j.Uses != "" {
			needs = joinNonEmpty("calls Workflow "+j.Uses, needs)
		}
		if len(instances) == 0 {
			d.add(indent, id+":", joinNonEmpty("Pending", needs))
		}
		for _, js := range instances {
			describeInstance(d, &js, needs, indent)
		}
		// The depth bound guards a snapshot written by hand in a cycle.
		if sub, ok := called[j.Uses]; ok && j.Uses != "" && depth < 8 {
			describeJobs(d, st, sub, called, id+"/", indent+1, depth+1)
		}
	}
}

func describeInstance(d *describer, js *v1alpha1.JobStatus, needs string, indent int) {
	head := joinNonEmpty(string(js.Phase), needs)
	if js.Attempt > 1 {
		head += fmt.Sprintf(", attempt %d", js.Attempt)
	}
	if js.Pod != "" {
		head += ", pod " + js.Pod
	}
	if span := spanOf(js.StartTime, js.CompletionTime); span != "-" {
		head += ", " + span
	}
	d.add(indent, js.Name+":", head)
	if js.Message != "" {
		d.add(indent+1, "Message:", js.Message)
	}
	for _, o := range js.Outputs {
		d.add(indent+1, "Output "+o.Name+":", o.Value)
	}
	for i, s := range js.Steps {
		name := s.Name
		if name == "" {
			name = s.ID
		}
		if name == "" {
			name = fmt.Sprintf("step %d", i+1)
		}
		line := dash(string(s.Phase))
		if s.ExitCode != nil {
			line += fmt.Sprintf(", exit %d", *s.ExitCode)
		}
		if span := spanOf(s.StartTime, s.CompletionTime); span != "-" {
			line += ", " + span
		}
		if s.Run != "" {
			line += ", run " + s.Run
		}
		if s.Message != "" {
			line += ": " + s.Message
		}
		d.add(indent+1, name+":", line)
		if sum := strings.TrimRight(d.summaries[s.Run], "\n"); s.Run != "" && sum != "" {
			d.add(indent+2, "Summary:", sum)
		}
	}
}

// jobInstances are the status entries of job id, in status order.
func jobInstances(all []v1alpha1.JobStatus, id string) []v1alpha1.JobStatus {
	var out []v1alpha1.JobStatus
	for _, j := range all {
		if j.Job == id {
			out = append(out, j)
		}
	}
	return out
}

func joinNonEmpty(parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, ", ")
}
