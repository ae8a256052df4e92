package wfexpr

import (
	"fmt"
	"strings"

	"github.com/rhysd/actionlint"

	"stoke.dev/stoke/internal/bounds"
)

// Error is an expression that does not parse, or names what does not
// exist: Offset is where in the text it went wrong (bytes from its start).
type Error struct {
	Offset int
	Msg    string
}

func (e *Error) Error() string { return fmt.Sprintf("at offset %d: %s", e.Offset, e.Msg) }

// Expr is one parsed expression.
type Expr struct {
	src  string
	root actionlint.ExprNode
	// status reports whether it calls success(), failure(), always() or
	// cancelled(); an if: that does not is success() && (it).
	status bool
	// hashFiles reports whether it calls hashFiles().
	hashFiles bool
}

// String is the expression's text.
func (e *Expr) String() string { return e.src }

// Template is a string with ${{ }} expressions in it.
type Template struct {
	lits  []string // len(exprs)+1 literal pieces around the expressions
	exprs []*Expr
}

// HasExpressions reports whether s has a ${{ in it.
func HasExpressions(s string) bool { return strings.Contains(s, "${{") }

// Parse parses a bare expression, as an if: is written ("${{ x }}" alone
// is the expression x, as GitHub reads it).
func Parse(src string) (*Expr, error) {
	if len(src) > bounds.WorkflowExpression {
		return nil, &Error{Offset: bounds.WorkflowExpression, Msg: fmt.Sprintf("is over %d bytes", bounds.WorkflowExpression)}
	}
	if t := strings.TrimSpace(src); strings.HasPrefix(t, "${{") && strings.HasSuffix(t, "}}") {
		tmpl, err := ParseTemplate(src)
		if err != nil {
			return nil, err
		}
		if len(tmpl.exprs) == 1 && strings.TrimSpace(tmpl.lits[0]) == "" && strings.TrimSpace(tmpl.lits[1]) == "" {
			return tmpl.exprs[0], nil
		}
	}
	if strings.TrimSpace(src) == "" {
		return nil, &Error{Offset: 0, Msg: "is empty"}
	}
	e, n, err := parseAt(src+"}}", 0)
	if err != nil {
		return nil, err
	}
	if n != len(src)+2 {
		return nil, &Error{Offset: n, Msg: "text after the expression"}
	}
	return e, nil
}

// ParseTemplate parses a string with ${{ }} expressions in it.
func ParseTemplate(s string) (*Template, error) {
	t := &Template{}
	rest, base := s, 0
	for {
		i := strings.Index(rest, "${{")
		if i < 0 {
			t.lits = append(t.lits, rest)
			return t, nil
		}
		t.lits = append(t.lits, rest[:i])
		start := i + 3
		e, n, err := parseAt(rest[start:], base+start)
		if err != nil {
			return nil, err
		}
		if len(e.src) > bounds.WorkflowExpression {
			return nil, &Error{Offset: base + start, Msg: fmt.Sprintf("an expression is over %d bytes", bounds.WorkflowExpression)}
		}
		t.exprs = append(t.exprs, e)
		rest = rest[start+n:]
		base += start + n
	}
}

// parseAt parses src, which must hold an expression ended by "}}", and
// returns it and how many bytes of src it took ("}}" included). off is
// src's offset in the text the caller reports positions in.
func parseAt(src string, off int) (*Expr, int, error) {
	lex := actionlint.NewExprLexer(src)
	root, perr := actionlint.NewExprParser().Parse(lex)
	if perr != nil {
		return nil, 0, &Error{Offset: off + perr.Offset, Msg: perr.Message}
	}
	n := lex.Offset()
	e := &Expr{src: strings.TrimSpace(strings.TrimSuffix(src[:n], "}}")), root: root}
	if err := e.check(off); err != nil {
		return nil, 0, err
	}
	return e, n, nil
}

// check refuses names no WorkflowRun has: an unknown context or function,
// or a function called with the wrong number of arguments.
func (e *Expr) check(off int) error {
	var err error
	actionlint.VisitExprNode(e.root, func(n, _ actionlint.ExprNode, entering bool) {
		if !entering || err != nil {
			return
		}
		switch n := n.(type) {
		case *actionlint.VariableNode:
			if !knownContexts[n.Name] {
				err = &Error{Offset: off + n.Token().Offset, Msg: fmt.Sprintf("unknown context %q (known: %s)", n.Name, strings.Join(contextNames, ", "))}
			}
		case *actionlint.FuncCallNode:
			f, ok := functions[strings.ToLower(n.Callee)]
			switch {
			case !ok:
				err = &Error{Offset: off + n.Token().Offset, Msg: fmt.Sprintf("unknown function %q", n.Callee)}
			case len(n.Args) < f.min || (f.max >= 0 && len(n.Args) > f.max):
				err = &Error{Offset: off + n.Token().Offset, Msg: fmt.Sprintf("%s takes %s, not %d", n.Callee, f.arity(), len(n.Args))}
			case f.status:
				e.status = true
			case f.hashFiles:
				e.hashFiles = true
			}
		}
	})
	return err
}

// Expressions returns the template's expressions.
func (t *Template) Expressions() []*Expr { return t.exprs }

// Check parses s as a template and reports what does not parse.
func Check(s string) error {
	_, err := ParseTemplate(s)
	return err
}

// Literals returns the template's literal text around its expressions:
// one more piece than Expressions (the workflow engine rewrites a step's
// script from them, each expression made an environment variable).
func (t *Template) Literals() []string { return t.lits }

// CallsHashFiles reports whether the expression calls hashFiles().
func (e *Expr) CallsHashFiles() bool { return e.hashFiles }

// CallsHashFiles reports whether any of the template's expressions calls
// hashFiles().
func (t *Template) CallsHashFiles() bool {
	for _, e := range t.exprs {
		if e.hashFiles {
			return true
		}
	}
	return false
}

// HashFilesCalls returns the patterns of each hashFiles() call in the
// expression (HashFilesPatterns of its arguments evaluated in c, on
// whatever branch the call is): what must be hashed before the
// expression is evaluated with c.HashFiles. A call whose arguments do not
// evaluate is left out; evaluating the expression then says why.
func (e *Expr) HashFilesCalls(c *Context) []string {
	if !e.hashFiles {
		return nil
	}
	var out []string
	ev := &evaluator{c: c, vars: map[string]any{}}
	actionlint.VisitExprNode(e.root, func(n, _ actionlint.ExprNode, entering bool) {
		call, ok := n.(*actionlint.FuncCallNode)
		if !entering || !ok || strings.ToLower(call.Callee) != "hashfiles" {
			return
		}
		args := make([]any, len(call.Args))
		for i, a := range call.Args {
			v, err := ev.eval(a)
			if err != nil {
				return
			}
			args[i] = unfilter(v)
		}
		if p, err := HashFilesPatterns(args); err == nil {
			out = append(out, p)
		}
	})
	return out
}

// HashFilesCalls is Expr.HashFilesCalls over the template's expressions.
func (t *Template) HashFilesCalls(c *Context) []string {
	var out []string
	for _, e := range t.exprs {
		out = append(out, e.HashFilesCalls(c)...)
	}
	return out
}
