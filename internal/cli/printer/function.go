package printer

import (
	"fmt"
	"io"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// Functions prints a list of Functions.
func (p *Printer) Functions(list *v1alpha1.FunctionList) error {
	switch p.format {
	case JSON, YAML:
		c := *list
		if c.Kind == "" {
			c.APIVersion, c.Kind = v1alpha1.GroupVersion.String(), "FunctionList"
		}
		if c.Items == nil {
			c.Items = []v1alpha1.Function{}
		}
		return p.object(&c)
	}
	rows := make([][]string, 0, len(list.Items))
	for i := range list.Items {
		rows = append(rows, p.functionRow(&list.Items[i]))
	}
	return p.table(p.functionHeader(), rows, len(list.Items) == 0)
}

// Function prints one Function.
func (p *Printer) Function(fn *v1alpha1.Function) error {
	switch p.format {
	case JSON, YAML:
		return p.object(fn)
	}
	return p.table(p.functionHeader(), [][]string{p.functionRow(fn)}, false)
}

// FunctionEvent prints one Function of a watch.
func (p *Printer) FunctionEvent(event string, fn *v1alpha1.Function) error {
	return p.event(event, fn, p.functionHeader, func() []string { return p.functionRow(fn) })
}

// The columns of `kubectl get functions` (docs/crds.md), READY as
// ready/desired as Deployments show it.
func (p *Printer) functionHeader() []string {
	h := []string{"NAME", "RUNTIME", "READY", "IN-FLIGHT", "QUEUED", "AGE"}
	if p.format == Wide {
		h = append(h, "REPLICAS", "MIN", "MAX", "HANDLER")
	}
	return p.namespaced(h, "NAMESPACE")
}

func (p *Printer) functionRow(fn *v1alpha1.Function) []string {
	if p.format == Name {
		return []string{"function/" + fn.Name}
	}
	s := &fn.Status
	r := []string{fn.Name, fn.Spec.Runtime, fmt.Sprintf("%d/%d", s.ReadyReplicas, Desired(fn)),
		fmt.Sprint(s.InFlight), fmt.Sprint(s.Queued), p.age(fn.CreationTimestamp.Time)}
	if p.format == Wide {
		r = append(r, fmt.Sprint(s.Replicas), fmt.Sprint(fn.Spec.Scale.Min), fmt.Sprint(fn.Spec.Scale.Max), fn.Spec.Handler)
	}
	return p.namespaced(r, fn.Namespace)
}

// Desired is the replicas a Function asks for: spec.replicas, or
// scale.min when unset, within [min, max] (internal/functionset's rule).
func Desired(fn *v1alpha1.Function) int32 {
	lo, hi := fn.Spec.Scale.Min, max(fn.Spec.Scale.Max, fn.Spec.Scale.Min)
	want := lo
	if r := fn.Spec.Replicas; r != nil {
		want = *r
	}
	return max(lo, min(want, hi))
}

// DescribeFunction prints a Function for people.
func DescribeFunction(w io.Writer, fn *v1alpha1.Function, now time.Time) error {
	var b strings.Builder
	line := func(k, v string) { fmt.Fprintf(&b, "%-18s %s\n", k, v) }
	s, st := &fn.Spec, &fn.Status
	line("Name:", fn.Name)
	line("Namespace:", fn.Namespace)
	line("Runtime:", s.Runtime)
	line("Handler:", s.Handler)
	if s.Timeout != nil {
		line("Replica timeout:", s.Timeout.Duration.String())
	}
	for _, e := range s.Env {
		line("Env:", e.Name+"="+e.Value)
	}
	line("Scale:", fmt.Sprintf("min %d, max %d, target in flight %d, idle %ds", s.Scale.Min, s.Scale.Max, s.Scale.TargetInFlight, s.Scale.IdleSeconds))
	wait := "-"
	if s.Queue.MaxWait != nil {
		wait = s.Queue.MaxWait.Duration.String()
	}
	line("Queue:", fmt.Sprintf("length %d, max wait %s", s.Queue.Length, wait))
	line("Replicas:", fmt.Sprintf("%d desired, %d ready, %d updated, %d in all", Desired(fn), st.ReadyReplicas, st.UpdatedReplicas, st.Replicas))
	line("Load:", fmt.Sprintf("%d in flight, %d queued", st.InFlight, st.Queued))
	if ls := st.LastScale; ls != nil {
		line("Last scale:", fmt.Sprintf("%d → %d at %s (%s ago): %s", ls.From, ls.To, ls.Time.UTC().Format(time.RFC3339), shortAge(now.Sub(ls.Time.Time)), ls.Reason))
	}
	if c := meta.FindStatusCondition(st.Conditions, "ReplicaFailure"); c != nil && c.Status == "True" {
		line("Replica failure:", c.Message)
	}
	line("Template hash:", dash(st.TemplateHash))
	line("Selector:", dash(st.Selector))
	line("Created:", fmt.Sprintf("%s (%s ago)", fn.CreationTimestamp.UTC().Format(time.RFC3339), shortAge(now.Sub(fn.CreationTimestamp.Time))))
	_, err := io.WriteString(w, b.String())
	return err
}

func shortAge(d time.Duration) string { return d.Round(time.Second).String() }
