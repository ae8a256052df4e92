// Package printer renders Runs and Runtimes for people and scripts: the
// tables of `stoke get` (kubectl-style columns, -o wide, a growing layout
// for -w), the objects as JSON or YAML, "kind/name" lines, and the
// multi-line view of `stoke describe`.
package printer

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/yaml"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
)

// Format is an output format of `stoke get`.
type Format string

// Output formats.
const (
	Table Format = ""
	Wide  Format = "wide"
	JSON  Format = "json"
	YAML  Format = "yaml"
	Name  Format = "name"
)

// Formats lists the formats -o accepts.
var Formats = []Format{Wide, JSON, YAML, Name}

// ParseFormat checks a -o value.
func ParseFormat(s string) (Format, error) {
	switch f := Format(s); f {
	case Table, Wide, JSON, YAML, Name:
		return f, nil
	}
	return "", errdefs.InvalidArgument("-o", "%q is not a format: one of wide, json, yaml, name", s)
}

// Printer writes objects in one format. For a table it keeps the column
// widths seen so far, so that rows printed one at a time (a watch) stay
// aligned as long as values fit.
type Printer struct {
	out           io.Writer
	format        Format
	allNamespaces bool
	now           func() time.Time

	widths  []int
	started bool // a watch wrote its header, or its first YAML document
	// watchEvents prints each watch event's type (kubectl's
	// --output-watch-events).
	watchEvents bool
}

// Watch event types, as a watch delivers them.
const (
	Added    = "ADDED"
	Modified = "MODIFIED"
	Deleted  = "DELETED"
)

// ShowWatchEvents makes the events of a watch print their type, as
// kubectl's --output-watch-events does: an EVENT column first in a
// table, {"type": ..., "object": ...} in JSON and YAML, "TYPE kind/name"
// with -o name.
func (p *Printer) ShowWatchEvents() { p.watchEvents = true }

// New returns a Printer writing to out. With allNamespaces, tables start
// with a NAMESPACE column. now is time.Now outside tests.
func New(out io.Writer, format Format, allNamespaces bool, now func() time.Time) *Printer {
	return &Printer{out: out, format: format, allNamespaces: allNamespaces, now: now}
}

// Runs prints a list of Runs: a table with a header, a RunList as JSON or
// YAML, or one run/NAME line each.
func (p *Printer) Runs(list *v1alpha1.RunList) error {
	switch p.format {
	case JSON, YAML:
		return p.object(withListKind(list))
	}
	rows := make([][]string, 0, len(list.Items))
	for i := range list.Items {
		rows = append(rows, p.runRow(&list.Items[i]))
	}
	return p.table(p.runHeader(), rows, len(list.Items) == 0)
}

// Run prints one Run: a table of one row, the object, or run/NAME.
func (p *Printer) Run(run *v1alpha1.Run) error {
	switch p.format {
	case JSON, YAML:
		return p.object(run)
	}
	return p.table(p.runHeader(), [][]string{p.runRow(run)}, false)
}

// RunEvent prints one Run of a watch (event is Added, Modified or
// Deleted): a row (the header before the first), one JSON object per
// line, or a YAML document. A deleted Run's row shows Deleted as its
// phase, since its last phase no longer holds (with ShowWatchEvents the
// EVENT column says so instead).
func (p *Printer) RunEvent(event string, run *v1alpha1.Run) error {
	return p.event(event, run, p.runHeader, func() []string {
		row := p.runRow(run)
		if event == Deleted && !p.watchEvents && p.format != Name {
			row[slices.Index(p.runHeader(), "PHASE")] = "Deleted"
		}
		return row
	})
}

// Runtimes prints a list of Runtimes.
func (p *Printer) Runtimes(list *v1alpha1.RuntimeList) error {
	switch p.format {
	case JSON, YAML:
		return p.object(withRuntimeListKind(list))
	}
	rows := make([][]string, 0, len(list.Items))
	for i := range list.Items {
		rows = append(rows, p.runtimeRow(&list.Items[i]))
	}
	return p.table(p.runtimeHeader(), rows, len(list.Items) == 0)
}

// Runtime prints one Runtime.
func (p *Printer) Runtime(rt *v1alpha1.Runtime) error {
	switch p.format {
	case JSON, YAML:
		return p.object(rt)
	}
	return p.table(p.runtimeHeader(), [][]string{p.runtimeRow(rt)}, false)
}

// RuntimeEvent prints one Runtime of a watch; with ShowWatchEvents its
// event type too.
func (p *Printer) RuntimeEvent(event string, rt *v1alpha1.Runtime) error {
	return p.event(event, rt, p.runtimeHeader, func() []string { return p.runtimeRow(rt) })
}

func (p *Printer) event(event string, obj any, header func() []string, row func() []string) error {
	if p.watchEvents {
		header0, row0 := header, row
		header = func() []string { return append([]string{"EVENT"}, header0()...) }
		row = func() []string { return append([]string{event}, row0()...) }
		obj = struct {
			Type   string `json:"type"`
			Object any    `json:"object"`
		}{event, obj}
	}
	switch p.format {
	case JSON:
		b, err := json.Marshal(obj)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(p.out, "%s\n", b)
		return err
	case YAML:
		b, err := yaml.Marshal(obj)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(p.out, "---\n%s", b)
		return err
	case Name:
		r := row()
		if p.watchEvents {
			_, err := fmt.Fprintln(p.out, r[0], r[1])
			return err
		}
		_, err := fmt.Fprintln(p.out, r[0])
		return err
	}
	if !p.started {
		p.started = true
		h := header()
		p.grow(h)
		// Rows come one at a time, so the widths cannot be measured
		// first: start from widths that fit typical values.
		p.grow(watchMinimums(h))
		if err := p.line(h); err != nil {
			return err
		}
	}
	r := row()
	p.grow(r)
	return p.line(r)
}

// watchMinimums returns, per column of header, a placeholder as wide as
// a typical value of that column.
func watchMinimums(header []string) []string {
	typical := map[string]int{"EVENT": 8, "NAMESPACE": 10, "NAME": 16, "RUNTIME": 8, "MODE": 8, "PHASE": 9,
		"REASON": 12, "POD": 14, "SERVER": 6}
	out := make([]string, len(header))
	for i, h := range header {
		out[i] = strings.Repeat(" ", typical[h])
	}
	return out
}

func (p *Printer) object(obj any) error {
	if p.format == YAML {
		b, err := yaml.Marshal(obj)
		if err != nil {
			return err
		}
		_, err = p.out.Write(b)
		return err
	}
	b, err := json.MarshalIndent(obj, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(p.out, "%s\n", b)
	return err
}

// table prints header and rows aligned; with -o name only the first
// column, which then holds kind/name.
func (p *Printer) table(header []string, rows [][]string, none bool) error {
	if p.format == Name {
		for _, r := range rows {
			if _, err := fmt.Fprintln(p.out, r[0]); err != nil {
				return err
			}
		}
		return nil
	}
	if none {
		return nil
	}
	p.grow(header)
	for _, r := range rows {
		p.grow(r)
	}
	if err := p.line(header); err != nil {
		return err
	}
	for _, r := range rows {
		if err := p.line(r); err != nil {
			return err
		}
	}
	return nil
}

func (p *Printer) grow(cells []string) {
	for i, c := range cells {
		if i >= len(p.widths) {
			p.widths = append(p.widths, 0)
		}
		p.widths[i] = max(p.widths[i], len([]rune(c)))
	}
}

// line writes cells padded to the known widths, three spaces apart, the
// last one unpadded.
func (p *Printer) line(cells []string) error {
	var b strings.Builder
	for i, c := range cells {
		b.WriteString(c)
		if i < len(cells)-1 {
			b.WriteString(strings.Repeat(" ", p.widths[i]-len([]rune(c))+3))
		}
	}
	b.WriteByte('\n')
	_, err := io.WriteString(p.out, b.String())
	return err
}

func (p *Printer) runHeader() []string {
	h := []string{"NAME", "RUNTIME", "MODE", "PHASE", "ATTEMPT", "AGE"}
	if p.format == Wide {
		h = append(h, "REASON", "EXIT", "POD", "ENDPOINT")
	}
	return p.namespaced(h, "NAMESPACE")
}

func (p *Printer) runRow(run *v1alpha1.Run) []string {
	if p.format == Name {
		return []string{"run/" + run.Name}
	}
	r := []string{run.Name, run.Spec.Runtime, Mode(run), StatusOf(run), orDash(run.Status.Attempt), p.age(run.CreationTimestamp.Time)}
	if p.format == Wide {
		exit := "-"
		if run.Status.ExitCode != nil {
			exit = fmt.Sprint(*run.Status.ExitCode)
		}
		r = append(r, dash(run.Status.Reason), exit, dash(run.Status.AssignedPod), dash(run.Status.Endpoint))
	}
	return p.namespaced(r, run.Namespace)
}

func (p *Printer) runtimeHeader() []string {
	h := []string{"NAME", "SERVER", "REPLICAS", "RUNS", "READY", "AGE"}
	if p.format == Wide {
		h = append(h, "INVOKE-TIMEOUT", "PODS")
	}
	return p.namespaced(h, "NAMESPACE")
}

func (p *Printer) runtimeRow(rt *v1alpha1.Runtime) []string {
	if p.format == Name {
		return []string{"runtime/" + rt.Name}
	}
	r := []string{rt.Name, rt.Spec.Server, fmt.Sprint(rt.Spec.Replicas), fmt.Sprint(rt.Spec.Runs),
		fmt.Sprintf("%d/%d", rt.Status.ReadyPods, rt.Spec.Replicas), p.age(rt.CreationTimestamp.Time)}
	if p.format == Wide {
		timeout := "-"
		if d := rt.Spec.DefaultInvokeTimeout; d != nil {
			timeout = d.Duration.String()
		}
		pods := make([]string, 0, len(rt.Status.Pods))
		for _, pod := range rt.Status.Pods {
			pods = append(pods, pod.Name)
		}
		r = append(r, timeout, dash(strings.Join(pods, ",")))
	}
	return p.namespaced(r, rt.Namespace)
}

func (p *Printer) namespaced(cells []string, ns string) []string {
	if !p.allNamespaces || p.format == Name {
		return cells
	}
	return append([]string{ns}, cells...)
}

func (p *Printer) age(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return duration.HumanDuration(p.now().Sub(t))
}

// Mode is "task" or "function".
func Mode(run *v1alpha1.Run) string {
	switch {
	case run.Spec.Mode.Function != nil:
		return "function"
	case run.Spec.Mode.Task != nil:
		return "task"
	}
	return "-"
}

// PhaseOf is the Run's phase; a Run no controller has touched yet is
// Pending.
func PhaseOf(run *v1alpha1.Run) v1alpha1.Phase {
	if run.Status.Phase == "" {
		return v1alpha1.PhasePending
	}
	return run.Status.Phase
}

// StatusOf is what a table shows in a Run's PHASE column: its phase,
// Terminating while it is being deleted (finalizers may hold it), as
// kubectl shows a Pod, or Held while spec.held keeps a Pending Run back
// (a Docker container created and not started; its status says Pending,
// with condition Scheduled=False, reason Held).
func StatusOf(run *v1alpha1.Run) string {
	switch {
	case run.DeletionTimestamp != nil:
		return "Terminating"
	case run.Spec.Held && PhaseOf(run) == v1alpha1.PhasePending:
		return "Held"
	}
	return string(PhaseOf(run))
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func orDash(n int32) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

// withListKind fills in a list's kind and an empty item list, so that
// JSON shows "items": [] rather than null.
func withListKind(l *v1alpha1.RunList) *v1alpha1.RunList {
	c := *l
	if c.Kind == "" {
		c.APIVersion, c.Kind = v1alpha1.GroupVersion.String(), "RunList"
	}
	if c.Items == nil {
		c.Items = []v1alpha1.Run{}
	}
	return &c
}

func withRuntimeListKind(l *v1alpha1.RuntimeList) *v1alpha1.RuntimeList {
	c := *l
	if c.Kind == "" {
		c.APIVersion, c.Kind = v1alpha1.GroupVersion.String(), "RuntimeList"
	}
	if c.Items == nil {
		c.Items = []v1alpha1.Runtime{}
	}
	return &c
}
