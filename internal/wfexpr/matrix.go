package wfexpr

import (
	"fmt"
	"sort"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
)

// Combination is one instance of a matrix job: its keys in order (the
// axes', then what include added) and their values.
type Combination struct {
	Keys   []string
	Values *Object
}

// ExpandMatrix is GitHub's strategy.matrix expansion. The combinations
// are the product of the axes, the first axis varying slowest, less every
// combination an exclude entry matches (each of its keys equal: a partial
// match). Then each include entry, in order, is merged into every
// original combination it does not contradict (it may not change an
// axis's value, but may overwrite what an earlier include added); an
// entry merged into none becomes a combination of its own, which later
// entries do not extend. A nil or empty matrix is one combination with no
// keys (a job that is not a matrix job). A combination's keys are named in
// the axes' order, then what include added in alphabetical order (GitHub
// keeps include's own order; the Kubernetes API server does not keep it).
// It refuses a matrix of more than
// bounds.WorkflowMatrix combinations (before building them), one that has
// none, exclude keys that are no axis, and entries that are not objects.
func ExpandMatrix(m *v1alpha1.Matrix) ([]Combination, error) {
	if m == nil || (len(m.Axes) == 0 && len(m.Include) == 0) {
		if m != nil && len(m.Exclude) > 0 {
			return nil, fmt.Errorf("exclude: the matrix has no axes to exclude from")
		}
		return []Combination{{Values: NewObject()}}, nil
	}
	if len(m.Axes) > bounds.WorkflowMatrixAxes {
		return nil, fmt.Errorf("axes: %d axes, over the bound of %d", len(m.Axes), bounds.WorkflowMatrixAxes)
	}
	axes := make([]string, len(m.Axes))
	values := make([][]any, len(m.Axes))
	product := 1
	for i, a := range m.Axes {
		axes[i] = a.Name
		if len(a.Values) == 0 {
			return nil, fmt.Errorf("axes[%d] (%s): has no values", i, a.Name)
		}
		for j, raw := range a.Values {
			v, err := ParseJSON(string(raw.Raw))
			if err != nil {
				return nil, fmt.Errorf("axes[%d].values[%d]: %w", i, j, err)
			}
			values[i] = append(values[i], sortKeys(v))
		}
		product *= len(a.Values)
		if product > bounds.WorkflowMatrix {
			return nil, fmt.Errorf("axes: the product of the axes is over the bound of %d combinations", bounds.WorkflowMatrix)
		}
	}
	exclude, err := entries("exclude", m.Exclude)
	if err != nil {
		return nil, err
	}
	for i, ex := range exclude {
		for _, k := range ex.Keys() {
			if !containsFold(axes, k) {
				return nil, fmt.Errorf("exclude[%d]: key %q is no axis of the matrix (%s)", i, k, strings.Join(axes, ", "))
			}
		}
	}
	include, err := entries("include", m.Include)
	if err != nil {
		return nil, err
	}

	var combos []Combination
	if len(axes) > 0 {
		idx := make([]int, len(axes))
		for {
			c := Combination{Keys: append([]string(nil), axes...), Values: NewObject()}
			for i, k := range axes {
				c.Values.Set(k, values[i][idx[i]])
			}
			if !excluded(c.Values, exclude) {
				combos = append(combos, c)
			}
			i := len(idx) - 1
			for ; i >= 0; i-- {
				idx[i]++
				if idx[i] < len(values[i]) {
					break
				}
				idx[i] = 0
			}
			if i < 0 {
				break
			}
		}
	}
	originals := len(combos)
	for _, in := range include {
		merged := false
		for ci := 0; ci < originals; ci++ {
			c := &combos[ci]
			if !compatible(c.Values, in, axes) {
				continue
			}
			for _, k := range in.Keys() {
				v, _ := in.Get(k)
				if _, had := c.Values.Get(k); !had {
					c.Keys = append(c.Keys, k)
				}
				c.Values.Set(k, v)
			}
			merged = true
		}
		if !merged {
			combos = append(combos, Combination{Keys: append([]string(nil), in.Keys()...), Values: in})
			if len(combos) > bounds.WorkflowMatrix {
				return nil, fmt.Errorf("include: the matrix is over the bound of %d combinations", bounds.WorkflowMatrix)
			}
		}
	}
	if len(combos) == 0 {
		return nil, fmt.Errorf("exclude: every combination of the matrix is excluded")
	}
	for i := range combos {
		c := &combos[i]
		c.Keys = orderKeys(c.Keys, axes)
		ordered := NewObject()
		for _, k := range c.Keys {
			v, _ := c.Values.Get(k)
			ordered.Set(k, v)
		}
		c.Values = ordered
	}
	for i, c := range combos {
		if n := c.valuesSize(); n > bounds.WorkflowMatrixValues {
			return nil, fmt.Errorf("combination %d (%s): its values are %d bytes, over the bound of %d", i, bounds.Truncate(c.Name(""), bounds.Quoted), n, bounds.WorkflowMatrixValues)
		}
	}
	return combos, nil
}

func entries(field string, raw []apiextensionsv1.JSON) ([]*Object, error) {
	out := make([]*Object, 0, len(raw))
	for i, r := range raw {
		v, err := ParseJSON(string(r.Raw))
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", field, i, err)
		}
		o, ok := sortKeys(v).(*Object)
		if !ok || o.Len() == 0 {
			return nil, fmt.Errorf("%s[%d]: must be an object with at least one key", field, i)
		}
		out = append(out, o)
	}
	return out, nil
}

// sortKeys orders every object's keys in v: the Kubernetes API server
// keeps no key order in a JSON object it stores (it sorts them), so a
// matrix must not depend on it for the two stores to agree.
func sortKeys(v any) any {
	switch t := v.(type) {
	case *Object:
		o := NewObject()
		keys := append([]string(nil), t.keys...)
		sort.Strings(keys)
		for _, k := range keys {
			e, _ := t.Get(k)
			o.Set(k, sortKeys(e))
		}
		return o
	case []any:
		out := make([]any, len(t), max(len(t), 1))
		for i, e := range t {
			out[i] = sortKeys(e)
		}
		return out
	}
	return v
}

// orderKeys puts a combination's keys in the order its name lists them:
// the axes as declared, then what include added, alphabetically.
func orderKeys(keys, axes []string) []string {
	out := make([]string, 0, len(keys))
	for _, a := range axes {
		for _, k := range keys {
			if strings.EqualFold(k, a) {
				out = append(out, k)
			}
		}
	}
	var rest []string
	for _, k := range keys {
		if !containsFold(axes, k) {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	return append(out, rest...)
}

func containsFold(list []string, s string) bool {
	for _, e := range list {
		if strings.EqualFold(e, s) {
			return true
		}
	}
	return false
}

// excluded reports whether an exclude entry matches the combination: each
// of the entry's keys has an equal value in it.
func excluded(c *Object, exclude []*Object) bool {
	for _, ex := range exclude {
		if matches(c, ex) {
			return true
		}
	}
	return false
}

func matches(c, partial *Object) bool {
	for _, k := range partial.Keys() {
		want, _ := partial.Get(k)
		got, ok := c.Get(k)
		if !ok || !deepEqual(got, want) {
			return false
		}
	}
	return true
}

// compatible reports whether an include entry may merge into a
// combination: it changes no axis value (keys an earlier include added
// may be overwritten).
func compatible(c, in *Object, axes []string) bool {
	for _, k := range in.Keys() {
		if !containsFold(axes, k) {
			continue
		}
		want, _ := in.Get(k)
		got, _ := c.Get(k)
		if !deepEqual(got, want) {
			return false
		}
	}
	return true
}

// deepEqual is JSON equality (strings exactly), as matrix matching needs.
func deepEqual(a, b any) bool {
	return ToJSON(a, false) == ToJSON(b, false)
}

// Name is the job instance's name as GitHub shows it: "id (v1, v2)", each
// value as a string (arrays and objects as compact JSON), or id alone
// when the combination has no keys.
func (c Combination) Name(id string) string {
	if len(c.Keys) == 0 {
		return id
	}
	parts := make([]string, len(c.Keys))
	for i, k := range c.Keys {
		v, _ := c.Values.Get(k)
		if primitive(v) {
			parts[i] = ToString(v)
		} else {
			parts[i] = ToJSON(v, false)
		}
	}
	return strings.TrimSpace(id + " (" + strings.Join(parts, ", ") + ")")
}

// Status is the combination as JobStatus.Matrix keeps it: key → the
// value's compact JSON.
func (c Combination) Status() map[string]string {
	if len(c.Keys) == 0 {
		return nil
	}
	m := make(map[string]string, len(c.Keys))
	for _, k := range c.Keys {
		v, _ := c.Values.Get(k)
		m[k] = ToJSON(v, false)
	}
	return m
}

func (c Combination) valuesSize() int {
	n := 0
	for k, v := range c.Status() {
		n += len(k) + len(v)
	}
	return n
}

// MatrixFromStatus rebuilds the matrix context from JobStatus.Matrix
// (keys sorted: a map keeps no order; the values are what matter).
func MatrixFromStatus(m map[string]string) (*Object, error) {
	o := NewObject()
	for _, k := range sortedKeys(m) {
		v, err := ParseJSON(m[k])
		if err != nil {
			return nil, fmt.Errorf("matrix %s: %w", k, err)
		}
		o.Set(k, v)
	}
	return o, nil
}
