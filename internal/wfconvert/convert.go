// Package wfconvert converts a GitHub Actions workflow file into a
// WorkflowRun spec: the subset Stoke runs (jobs with needs, if, runs-on,
// env, timeout-minutes, strategy.matrix with include and exclude,
// fail-fast and max-parallel, outputs, a reusable Workflow's uses and
// with; steps with id, name, if, run, shell, env, working-directory,
// continue-on-error, timeout-minutes, and the checkout, upload-artifact and
// download-artifact actions). `on:` and what only GitHub's hosting means
// (name, run-name, permissions) are ignored; every other key is refused,
// naming it and its line.
package wfconvert

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/validation"
)

// Options say where a file's jobs run.
type Options struct {
	// RunsOn maps a runs-on label to a Runtime.
	RunsOn map[string]string
	// DefaultRuntime is the Runtime of a label RunsOn does not map. Without
	// it, a label that is a Runtime's name (a DNS-1123 label) is used as
	// one, and any other is refused.
	DefaultRuntime string
}

// maxProblems bounds the problems one conversion lists.
const maxProblems = 16

// ignored are keys that mean something only on GitHub's hosting; the
// rest of a file runs the same without them.
var ignored = map[string]bool{"on": true, "name": true, "run-name": true, "permissions": true}

// actions maps the actions Stoke runs to its step uses:.
var actions = map[string]string{
	"actions/checkout":          v1alpha1.UsesCheckout,
	"actions/upload-artifact":   v1alpha1.UsesUploadArtifact,
	"actions/download-artifact": v1alpha1.UsesDownloadArtifact,
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// Convert reads a GitHub Actions workflow file and returns the
// WorkflowRun that runs it (no name: the caller names it). Problems come
// back together (at most 16), each an InvalidArgument naming the key's
// path and line.
func Convert(data []byte, o Options) (*v1alpha1.WorkflowRun, error) {
	if err := validation.YAMLExpansion("workflow file", data); err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, errdefs.InvalidArgument("workflow file", "not valid YAML: %v", err)
	}
	c := &converter{o: o}
	if len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, errdefs.InvalidArgument("workflow file", "must be a mapping (name:, on:, jobs:)")
	}
	w := &v1alpha1.WorkflowRun{}
	w.APIVersion, w.Kind = v1alpha1.GroupVersion.String(), v1alpha1.KindWorkflowRun
	sawJobs := false
	c.each(doc.Content[0], "", func(key string, k, v *yaml.Node) {
		switch key {
		case "env":
			w.Spec.Env = c.env(v, key)
		case "jobs":
			sawJobs = true
			if v.Kind != yaml.MappingNode {
				c.fail(v, key, "must be a mapping of job ids to jobs")
				return
			}
			c.each(v, key, func(id string, _, jv *yaml.Node) {
				w.Spec.Jobs = append(w.Spec.Jobs, c.job(id, jv, key+"."+id))
			})
		default:
			if !ignored[key] {
				c.unsupported(k, key)
			}
		}
	})
	if !sawJobs {
		c.fail(doc.Content[0], "jobs", "is missing")
	}
	if err := c.err(); err != nil {
		return nil, err
	}
	return w, nil
}

type converter struct {
	o        Options
	problems []error
	dropped  int
}

func (c *converter) fail(n *yaml.Node, path, format string, args ...any) {
	if len(c.problems) >= maxProblems {
		c.dropped++
		return
	}
	c.problems = append(c.problems, errdefs.InvalidArgument(path, "%s (line %d)", fmt.Sprintf(format, args...), n.Line))
}

func (c *converter) unsupported(k *yaml.Node, path string) {
	c.fail(k, path, "is not supported by Stoke's workflows (docs/workflows.md lists the keys it runs)")
}

func (c *converter) err() error {
	errs := c.problems
	if c.dropped > 0 {
		errs = append(errs, errdefs.Errorf(errdefs.ErrInvalidArgument, "and %d more problems", c.dropped))
	}
	return errors.Join(errs...)
}

// each calls fn for each key of a mapping, in order.
func (c *converter) each(m *yaml.Node, path string, fn func(key string, k, v *yaml.Node)) {
	if m.Kind != yaml.MappingNode {
		c.fail(m, path, "must be a mapping")
		return
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		fn(k.Value, k, v)
	}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// scalar is a scalar's text as written (true, 3, 'x' → x).
func (c *converter) scalar(n *yaml.Node, path string) string {
	if n.Kind != yaml.ScalarNode {
		c.fail(n, path, "must be a single value")
		return ""
	}
	if n.Tag == "!!null" {
		return ""
	}
	return n.Value
}

func (c *converter) int32(n *yaml.Node, path string) int32 {
	s := c.scalar(n, path)
	if s == "" {
		return 0
	}
	v, err := strconv.ParseInt(s, 10, 32)
	if err != nil {
		c.fail(n, path, "%q must be a whole number (an expression is not supported here)", s)
	}
	return int32(v)
}

func (c *converter) bool(n *yaml.Node, path string) bool {
	switch s := c.scalar(n, path); s {
	case "true":
		return true
	case "false", "":
		return false
	default:
		c.fail(n, path, "%q must be true or false (an expression is not supported here)", s)
	}
	return false
}

func (c *converter) strings(n *yaml.Node, path string) []string {
	if n.Kind == yaml.ScalarNode {
		return []string{c.scalar(n, path)}
	}
	if n.Kind != yaml.SequenceNode {
		c.fail(n, path, "must be a value or a list")
		return nil
	}
	out := make([]string, 0, len(n.Content))
	for i, e := range n.Content {
		out = append(out, c.scalar(e, fmt.Sprintf("%s[%d]", path, i)))
	}
	return out
}

func (c *converter) env(n *yaml.Node, path string) []v1alpha1.EnvVar {
	var out []v1alpha1.EnvVar
	c.each(n, path, func(key string, _, v *yaml.Node) {
		out = append(out, v1alpha1.EnvVar{Name: key, Value: c.scalar(v, join(path, key))})
	})
	return out
}

func (c *converter) nameValues(n *yaml.Node, path string) []v1alpha1.NameValue {
	var out []v1alpha1.NameValue
	c.each(n, path, func(key string, _, v *yaml.Node) {
		out = append(out, v1alpha1.NameValue{Name: key, Value: c.scalar(v, join(path, key))})
	})
	return out
}

func (c *converter) job(id string, n *yaml.Node, path string) v1alpha1.Job {
	j := v1alpha1.Job{ID: id}
	c.each(n, path, func(key string, k, v *yaml.Node) {
		p := join(path, key)
		switch key {
		case "name":
			j.Name = c.scalar(v, p)
		case "needs":
			j.Needs = c.strings(v, p)
		case "if":
			j.If = c.scalar(v, p)
		case "runs-on":
			j.RunsOn = c.runsOn(v, p)
		case "env":
			j.Env = c.env(v, p)
		case "timeout-minutes":
			j.TimeoutMinutes = c.int32(v, p)
		case "strategy":
			j.Strategy = c.strategy(v, p)
		case "outputs":
			j.Outputs = c.nameValues(v, p)
		case "steps":
			if v.Kind != yaml.SequenceNode {
				c.fail(v, p, "must be a list of steps")
				return
			}
			for i, s := range v.Content {
				j.Steps = append(j.Steps, c.step(s, fmt.Sprintf("%s[%d]", p, i)))
			}
		case "uses":
			uses := c.scalar(v, p)
			if !dnsLabel.MatchString(uses) {
				c.fail(v, p, "%q: a job's uses names a Workflow stored in the namespace (stoke apply -f it), not a file or a repository", uses)
			}
			j.Uses = uses
		case "with":
			j.With = c.nameValues(v, p)
		case "permissions":
		default:
			c.unsupported(k, p)
		}
	})
	return j
}

// runsOn maps a label (or the first of a list) to a Runtime; an
// expression is kept for the engine to evaluate per matrix instance.
func (c *converter) runsOn(n *yaml.Node, path string) string {
	labels := c.strings(n, path)
	if len(labels) == 0 {
		c.fail(n, path, "must name a label")
		return ""
	}
	label := labels[0]
	if strings.Contains(label, "${{") {
		return label
	}
	if rt, ok := c.o.RunsOn[label]; ok {
		return rt
	}
	if c.o.DefaultRuntime != "" {
		return c.o.DefaultRuntime
	}
	if dnsLabel.MatchString(label) {
		return label
	}
	c.fail(n, path, "%q is no Runtime: map it (--runs-on %s=RUNTIME) or give a default Runtime", label, label)
	return ""
}

func (c *converter) strategy(n *yaml.Node, path string) *v1alpha1.Strategy {
	st := &v1alpha1.Strategy{}
	c.each(n, path, func(key string, k, v *yaml.Node) {
		p := join(path, key)
		switch key {
		case "fail-fast":
			b := c.bool(v, p)
			st.FailFast = &b
		case "max-parallel":
			st.MaxParallel = c.int32(v, p)
		case "matrix":
			st.Matrix = c.matrix(v, p)
		default:
			c.unsupported(k, p)
		}
	})
	return st
}

func (c *converter) matrix(n *yaml.Node, path string) *v1alpha1.Matrix {
	if n.Kind == yaml.ScalarNode {
		c.fail(n, path, "a matrix made by an expression is not supported: write its axes")
		return nil
	}
	m := &v1alpha1.Matrix{}
	c.each(n, path, func(key string, _, v *yaml.Node) {
		p := join(path, key)
		switch key {
		case "include", "exclude":
			if v.Kind != yaml.SequenceNode {
				c.fail(v, p, "must be a list of objects")
				return
			}
			for i, e := range v.Content {
				raw := c.json(e, fmt.Sprintf("%s[%d]", p, i))
				if key == "include" {
					m.Include = append(m.Include, raw)
				} else {
					m.Exclude = append(m.Exclude, raw)
				}
			}
		default:
			if v.Kind != yaml.SequenceNode {
				c.fail(v, p, "must be a list of values (an expression is not supported here)")
				return
			}
			a := v1alpha1.MatrixAxis{Name: key}
			for i, e := range v.Content {
				a.Values = append(a.Values, c.json(e, fmt.Sprintf("%s[%d]", p, i)))
			}
			m.Axes = append(m.Axes, a)
		}
	})
	return m
}

// json is a YAML value as JSON.
func (c *converter) json(n *yaml.Node, path string) apiextensionsv1.JSON {
	var v any
	if err := n.Decode(&v); err != nil {
		c.fail(n, path, "%v", err)
		return apiextensionsv1.JSON{Raw: []byte("null")}
	}
	b, err := json.Marshal(v)
	if err != nil {
		c.fail(n, path, "cannot be JSON: %v", err)
		return apiextensionsv1.JSON{Raw: []byte("null")}
	}
	return apiextensionsv1.JSON{Raw: b}
}

func (c *converter) step(n *yaml.Node, path string) v1alpha1.Step {
	var s v1alpha1.Step
	c.each(n, path, func(key string, k, v *yaml.Node) {
		p := join(path, key)
		switch key {
		case "id":
			s.ID = c.scalar(v, p)
		case "name":
			s.Name = c.scalar(v, p)
		case "if":
			s.If = c.scalar(v, p)
		case "run":
			s.Run = c.scalar(v, p)
		case "shell":
			s.Shell = c.scalar(v, p)
		case "env":
			s.Env = c.env(v, p)
		case "working-directory":
			s.WorkingDirectory = c.scalar(v, p)
		case "uses":
			s.Uses = c.action(v, p)
		case "with":
			s.With = c.nameValues(v, p)
		case "continue-on-error":
			s.ContinueOnError = c.bool(v, p)
		case "timeout-minutes":
			s.TimeoutMinutes = c.int32(v, p)
		default:
			c.unsupported(k, p)
		}
	})
	return s
}

// action maps actions/checkout@v4 and its kin to Stoke's step uses;
// anything else is refused, naming it.
func (c *converter) action(n *yaml.Node, path string) string {
	uses := c.scalar(n, path)
	name, _, _ := strings.Cut(uses, "@")
	if u, ok := actions[strings.ToLower(name)]; ok {
		return u
	}
	for _, u := range validation.StepUses {
		if uses == u {
			return u
		}
	}
	c.fail(n, path, "%q is not an action Stoke runs (it runs %s, and their actions/ names)", uses, strings.Join(validation.StepUses, ", "))
	return ""
}
