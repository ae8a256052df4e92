package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/cli/printer"
	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/workflow"
)

// Kind is a resource kind a command names.
type Kind string

// Kinds.
const (
	KindRun      Kind = "run"
	KindRuntime  Kind = "runtime"
	KindFunction Kind = "function"
	// KindWorkflowRun and KindWorkflow are issue 22's kinds.
	KindWorkflowRun Kind = "workflowrun"
	KindWorkflow    Kind = "workflow"
)

// ParseKind accepts the spellings kubectl users type: run, runs,
// runtime, runtimes, rt, function, functions, fn, workflowrun,
// workflowruns, wfr, workflow, workflows, wf.
func ParseKind(s string) (Kind, error) {
	switch s {
	case "run", "runs":
		return KindRun, nil
	case "runtime", "runtimes", "rt":
		return KindRuntime, nil
	case "function", "functions", "fn":
		return KindFunction, nil
	case "workflowrun", "workflowruns", "wfr":
		return KindWorkflowRun, nil
	case "workflow", "workflows", "wf":
		return KindWorkflow, nil
	}
	return "", errdefs.InvalidArgument("resource", "%q is not a resource: want runs, runtimes, functions, workflowruns or workflows", s)
}

// GetOptions are `stoke get`'s arguments.
type GetOptions struct {
	Kind Kind
	// Name, when set, selects one object.
	Name          string
	Namespace     string
	AllNamespaces bool
	LabelSelector string
	Watch         bool
	// WatchEvents prints each watch event's type (--output-watch-events).
	WatchEvents bool
	Format      printer.Format
	// Now is time.Now outside tests.
	Now func() time.Time
}

// Get lists or gets Runs or Runtimes and prints them; with Watch it then
// prints every change until ctx ends (Ctrl-C: ExitInterrupted).
func Get(ctx context.Context, c client.API, o GetOptions, s Streams) error {
	if o.AllNamespaces && o.Name != "" {
		return errdefs.InvalidArgument("--all-namespaces", "cannot be used with a name")
	}
	ns := o.Namespace
	if o.AllNamespaces {
		ns = ""
	}
	p := printer.New(s.Out, o.Format, o.AllNamespaces, o.Now)
	if o.WatchEvents {
		p.ShowWatchEvents()
	}
	if o.Watch {
		err := watchObjects(ctx, c, o, ns, p)
		if ctx.Err() != nil {
			return interrupted()
		}
		return err
	}
	opts := client.ListOptions{LabelSelector: o.LabelSelector}
	switch {
	case o.Kind == KindWorkflowRun && o.Name != "":
		w, err := c.GetWorkflowRun(ctx, ns, o.Name)
		if err != nil {
			return err
		}
		return p.WorkflowRun(w)
	case o.Kind == KindWorkflowRun:
		list, err := c.ListWorkflowRuns(ctx, ns, opts)
		if err != nil {
			return err
		}
		if len(list.Items) == 0 && (o.Format == printer.Table || o.Format == printer.Wide) {
			s.note("no workflowruns found%s", inNamespace(ns))
		}
		return p.WorkflowRuns(list)
	case o.Kind == KindWorkflow && o.Name != "":
		w, err := c.GetWorkflow(ctx, ns, o.Name)
		if err != nil {
			return err
		}
		return p.Workflow(w)
	case o.Kind == KindWorkflow:
		list, err := c.ListWorkflows(ctx, ns, opts)
		if err != nil {
			return err
		}
		if len(list.Items) == 0 && (o.Format == printer.Table || o.Format == printer.Wide) {
			s.note("no workflows found%s", inNamespace(ns))
		}
		return p.Workflows(list)
	case o.Kind == KindFunction && o.Name != "":
		fn, err := c.GetFunction(ctx, ns, o.Name)
		if err != nil {
			return err
		}
		return p.Function(fn)
	case o.Kind == KindFunction:
		list, err := c.ListFunctions(ctx, ns, opts)
		if err != nil {
			return err
		}
		if len(list.Items) == 0 && (o.Format == printer.Table || o.Format == printer.Wide) {
			s.note("no functions found%s", inNamespace(ns))
		}
		return p.Functions(list)
	case o.Kind == KindRun && o.Name != "":
		run, err := c.GetRun(ctx, ns, o.Name)
		if err != nil {
			return err
		}
		return p.Run(run)
	case o.Kind == KindRun:
		list, err := c.ListRuns(ctx, ns, opts)
		if err != nil {
			return err
		}
		if len(list.Items) == 0 && (o.Format == printer.Table || o.Format == printer.Wide) {
			s.note("no runs found%s", inNamespace(ns))
		}
		return p.Runs(list)
	case o.Name != "":
		rt, err := c.GetRuntime(ctx, ns, o.Name)
		if err != nil {
			return err
		}
		return p.Runtime(rt)
	default:
		list, err := c.ListRuntimes(ctx, ns, opts)
		if err != nil {
			return err
		}
		if len(list.Items) == 0 && (o.Format == printer.Table || o.Format == printer.Wide) {
			s.note("no runtimes found%s", inNamespace(ns))
		}
		return p.Runtimes(list)
	}
}

func inNamespace(ns string) string {
	if ns == "" {
		return ""
	}
	return " in namespace " + ns
}

// watchObjects prints the current objects, then every change; a deletion
// is shown as one (printer.RunEvent).
func watchObjects(ctx context.Context, c client.API, o GetOptions, ns string, p *printer.Printer) error {
	opts := client.ListOptions{LabelSelector: o.LabelSelector}
	switch o.Kind {
	case KindWorkflowRun:
		w, err := c.WatchWorkflowRuns(ctx, ns, opts)
		if err != nil {
			return err
		}
		return printEvents(w, o.Name, func(w *v1alpha1.WorkflowRun) string { return w.Name }, p.WorkflowRunEvent)
	case KindWorkflow:
		w, err := c.WatchWorkflows(ctx, ns, opts)
		if err != nil {
			return err
		}
		return printEvents(w, o.Name, func(w *v1alpha1.Workflow) string { return w.Name }, p.WorkflowEvent)
	}
	if o.Kind == KindFunction {
		w, err := c.WatchFunctions(ctx, ns, opts)
		if err != nil {
			return err
		}
		return printEvents(w, o.Name, func(fn *v1alpha1.Function) string { return fn.Name }, p.FunctionEvent)
	}
	if o.Kind == KindRun {
		w, err := c.WatchRuns(ctx, ns, opts)
		if err != nil {
			return err
		}
		return printEvents(w, o.Name, func(run *v1alpha1.Run) string { return run.Name }, p.RunEvent)
	}
	w, err := c.WatchRuntimes(ctx, ns, opts)
	if err != nil {
		return err
	}
	return printEvents(w, o.Name, func(rt *v1alpha1.Runtime) string { return rt.Name }, p.RuntimeEvent)
}

// printEvents prints each watched object named name ("" for all) until the
// watch ends, and closes it.
func printEvents[T any](w *client.Watch[T], name string, nameOf func(*T) string, show func(string, *T) error) error {
	defer w.Close()
	for {
		ev, err := w.Next()
		if err != nil {
			return endOfWatch(err)
		}
		if name == "" || nameOf(ev.Object) == name {
			if err := show(string(ev.Type), ev.Object); err != nil {
				return err
			}
		}
	}
}

func endOfWatch(err error) error {
	if errors.Is(err, io.EOF) {
		return errdefs.Errorf(errdefs.ErrUnavailable, "the server closed the watch")
	}
	return err
}

// Describe prints one Run, Runtime, Function or WorkflowRun for people
// (a WorkflowRun as its DAG: each job's phase, each step's phase, exit
// code and duration).
func Describe(ctx context.Context, c client.API, kind Kind, ns, name string, now time.Time, s Streams) error {
	switch kind {
	case KindWorkflowRun:
		w, err := c.GetWorkflowRun(ctx, ns, name)
		if err != nil {
			return err
		}
		// Step summaries stay in the step Runs' status, as their outputs.
		runs, err := c.ListRuns(ctx, w.Namespace, client.ListOptions{LabelSelector: workflow.LabelWorkflowRun + "=" + w.Name})
		if err != nil {
			return err
		}
		steps := map[string]bool{}
		for _, js := range w.Status.Jobs {
			for _, st := range js.Steps {
				steps[st.Run] = st.Run != ""
			}
		}
		summaries := map[string]string{}
		for _, r := range runs.Items {
			if steps[r.Name] && r.Status.Summary != "" {
				summaries[r.Name] = r.Status.Summary
			}
		}
		return printer.DescribeWorkflowRun(s.Out, w, summaries, now)
	case KindWorkflow:
		return errdefs.InvalidArgument("resource", "describe takes a workflowrun; stoke get workflow %s -o yaml shows a Workflow", name)
	}
	if kind == KindFunction {
		fn, err := c.GetFunction(ctx, ns, name)
		if err != nil {
			return err
		}
		if err := printer.DescribeFunction(s.Out, fn, now); err != nil {
			return err
		}
		fmt.Fprintf(s.Out, "Invoke:            stoke invoke %s%s -d '{}'  (%s)\n", fn.Name, namespaceFlag(fn.Namespace), FunctionURL(c.Target(), fn.Namespace, fn.Name))
		return nil
	}
	if kind == KindRuntime {
		rt, err := c.GetRuntime(ctx, ns, name)
		if err != nil {
			return err
		}
		return printer.DescribeRuntime(s.Out, rt, now)
	}
	run, err := c.GetRun(ctx, ns, name)
	if err != nil {
		return err
	}
	if err := printer.DescribeRun(s.Out, run, now); err != nil {
		return err
	}
	if run.Status.Phase == "Ready" && run.Status.Endpoint != "" {
		fmt.Fprintf(s.Out, "Invoke:  stoke invoke %s%s -d '{}'\n", run.Name, namespaceFlag(run.Namespace))
	}
	return nil
}
