package wfexpr

import (
	"fmt"
	"math"
	"strings"

	"github.com/rhysd/actionlint"

	"stoke.dev/stoke/internal/bounds"
)

// filtered is an array an object filter (a.*) made: a property or index
// of it applies to each element, keeping what is not null, as GitHub's
// filtered arrays do.
type filtered []any

// evaluator evaluates one expression against one Context.
type evaluator struct {
	c    *Context
	vars map[string]any // each context built once, so that it equals itself
}

// Eval evaluates the expression.
func (e *Expr) Eval(c *Context) (any, error) {
	ev := &evaluator{c: c, vars: map[string]any{}}
	v, err := ev.eval(e.root)
	if err != nil {
		return nil, fmt.Errorf("evaluating %q: %w", bounds.Truncate(e.src, bounds.Quoted), err)
	}
	if f, ok := v.(filtered); ok {
		v = []any(f)
	}
	return v, nil
}

// EvalIf evaluates an if: (bare or in ${{ }}): an expression that calls no
// status function (success, failure, always, cancelled) is
// success() && (it), as GitHub reads it.
func (e *Expr) EvalIf(c *Context) (bool, error) {
	if !e.status && (c.Cancelled || c.status() != "success") {
		return false, nil
	}
	v, err := e.Eval(c)
	if err != nil {
		return false, err
	}
	return Truthy(v), nil
}

// Eval evaluates the template: a template that is one expression alone
// gives its value as it is; any other gives a string (each value as
// ToString writes it, between the literal text).
func (t *Template) Eval(c *Context) (any, error) {
	if len(t.exprs) == 1 && t.lits[0] == "" && t.lits[1] == "" {
		return t.exprs[0].Eval(c)
	}
	return t.EvalString(c)
}

// EvalString evaluates the template to a string, bounded by
// bounds.WorkflowValue.
func (t *Template) EvalString(c *Context) (string, error) {
	var b strings.Builder
	for i, lit := range t.lits {
		b.WriteString(lit)
		if i < len(t.exprs) {
			v, err := t.exprs[i].Eval(c)
			if err != nil {
				return "", err
			}
			b.WriteString(ToString(v))
		}
		if b.Len() > bounds.WorkflowValue {
			return "", fmt.Errorf("the value is over %d bytes", bounds.WorkflowValue)
		}
	}
	return b.String(), nil
}

// EvalString parses and evaluates s as a template, to a string.
func EvalString(s string, c *Context) (string, error) {
	t, err := ParseTemplate(s)
	if err != nil {
		return "", err
	}
	return t.EvalString(c)
}

// successIf is the if: of a job or step that has none, parsed once:
// most have none, and evaluation only reads the tree.
var successIf = func() *Expr {
	e, err := Parse("success()")
	if err != nil {
		panic(err)
	}
	return e
}()

// EvalIf parses and evaluates an if: ("" is success()).
func EvalIf(s string, c *Context) (bool, error) {
	if strings.TrimSpace(s) == "" {
		return successIf.EvalIf(c)
	}
	e, err := Parse(s)
	if err != nil {
		return false, err
	}
	return e.EvalIf(c)
}

func (ev *evaluator) eval(n actionlint.ExprNode) (any, error) {
	switch n := n.(type) {
	case *actionlint.NullNode:
		return nil, nil
	case *actionlint.BoolNode:
		return n.Value, nil
	case *actionlint.IntNode:
		return float64(n.Value), nil
	case *actionlint.FloatNode:
		return n.Value, nil
	case *actionlint.StringNode:
		return n.Value, nil
	case *actionlint.VariableNode:
		if v, ok := ev.vars[n.Name]; ok {
			return v, nil
		}
		v := ev.c.variable(n.Name)
		ev.vars[n.Name] = v
		return v, nil
	case *actionlint.ObjectDerefNode:
		recv, err := ev.eval(n.Receiver)
		if err != nil {
			return nil, err
		}
		return index(recv, n.Property), nil
	case *actionlint.IndexAccessNode:
		recv, err := ev.eval(n.Operand)
		if err != nil {
			return nil, err
		}
		idx, err := ev.eval(n.Index)
		if err != nil {
			return nil, err
		}
		return index(recv, idx), nil
	case *actionlint.ArrayDerefNode:
		recv, err := ev.eval(n.Receiver)
		if err != nil {
			return nil, err
		}
		return star(recv), nil
	case *actionlint.NotOpNode:
		v, err := ev.eval(n.Operand)
		if err != nil {
			return nil, err
		}
		return !Truthy(v), nil
	case *actionlint.LogicalOpNode:
		l, err := ev.eval(n.Left)
		if err != nil {
			return nil, err
		}
		// && and || give an operand, not a boolean, and do not evaluate
		// the right one when the left decides.
		if (n.Kind == actionlint.LogicalOpNodeKindAnd) != Truthy(l) {
			return l, nil
		}
		return ev.eval(n.Right)
	case *actionlint.CompareOpNode:
		l, err := ev.eval(n.Left)
		if err != nil {
			return nil, err
		}
		r, err := ev.eval(n.Right)
		if err != nil {
			return nil, err
		}
		l, r = unfilter(l), unfilter(r)
		switch n.Kind {
		case actionlint.CompareOpNodeKindEq:
			return Equal(l, r), nil
		case actionlint.CompareOpNodeKindNotEq:
			return !Equal(l, r), nil
		}
		cmp, ok := compare(l, r)
		if !ok {
			return false, nil
		}
		switch n.Kind {
		case actionlint.CompareOpNodeKindLess:
			return cmp < 0, nil
		case actionlint.CompareOpNodeKindLessEq:
			return cmp <= 0, nil
		case actionlint.CompareOpNodeKindGreater:
			return cmp > 0, nil
		case actionlint.CompareOpNodeKindGreaterEq:
			return cmp >= 0, nil
		}
	case *actionlint.FuncCallNode:
		args := make([]any, len(n.Args))
		for i, a := range n.Args {
			v, err := ev.eval(a)
			if err != nil {
				return nil, err
			}
			args[i] = unfilter(v)
		}
		f := functions[strings.ToLower(n.Callee)]
		return f.call(ev.c, args)
	}
	return nil, fmt.Errorf("unsupported expression node %T", n)
}

func unfilter(v any) any {
	if f, ok := v.(filtered); ok {
		return []any(f)
	}
	return v
}

// index is v[key] (and v.key): an object's property ignoring case, an
// array's element (the index floored; out of range is null), and on a
// filtered array each element's; anything else is null.
func index(v, key any) any {
	switch t := v.(type) {
	case *Object:
		got, _ := t.Get(ToString(key))
		return got
	case []any:
		f := ToNumber(key) // "1" indexes as 1 does

		if math.IsNaN(f) || f < 0 {
			return nil
		}
		i := math.Floor(f)
		if i >= float64(len(t)) {
			return nil
		}
		return t[int(i)]
	case filtered:
		out := filtered{}
		for _, e := range t {
			if got := index(e, key); got != nil {
				out = append(out, got)
			}
		}
		return out
	}
	return nil
}

// star is v.*: an array's elements, an object's values; on a filtered
// array, each element's, flattened one level.
func star(v any) any {
	switch t := v.(type) {
	case []any:
		return filtered(append([]any(nil), t...))
	case *Object:
		return filtered(append([]any(nil), t.vals...))
	case filtered:
		out := filtered{}
		for _, e := range t {
			switch et := e.(type) {
			case []any:
				out = append(out, et...)
			case *Object:
				out = append(out, et.vals...)
			}
		}
		return out
	}
	return filtered{}
}
