package wfexpr

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"stoke.dev/stoke/internal/bounds"
)

// function is one built-in: its arity and what it does.
type function struct {
	min, max int // max -1: any number
	// status marks success(), failure(), always() and cancelled().
	status bool
	// hashFiles marks hashFiles(), which reads the job's workspace.
	hashFiles bool
	call      func(c *Context, args []any) (any, error)
}

func (f function) arity() string {
	switch {
	case f.min == f.max && f.min == 1:
		return "1 argument"
	case f.min == f.max:
		return fmt.Sprintf("%d arguments", f.min)
	case f.max < 0:
		return fmt.Sprintf("at least %d arguments", f.min)
	}
	return fmt.Sprintf("%d to %d arguments", f.min, f.max)
}

// functions are GitHub's built-ins, by lower-cased name (GitHub's names
// are case-insensitive).
var functions = map[string]function{
	"contains":   {min: 2, max: 2, call: contains},
	"startswith": {min: 2, max: 2, call: stringPredicate(strings.HasPrefix)},
	"endswith":   {min: 2, max: 2, call: stringPredicate(strings.HasSuffix)},
	"format":     {min: 1, max: -1, call: format},
	"join":       {min: 1, max: 2, call: join},
	"tojson": {min: 1, max: 1, call: func(_ *Context, a []any) (any, error) {
		return bounded(ToJSON(a[0], true))
	}},
	"fromjson": {min: 1, max: 1, call: func(_ *Context, a []any) (any, error) {
		v, err := ParseJSON(ToString(a[0]))
		if err != nil {
			return nil, fmt.Errorf("fromJSON: %w", err)
		}
		return v, nil
	}},
	"hashfiles": {min: 1, max: -1, hashFiles: true, call: hashFiles},
	"success": {max: 0, status: true, call: func(c *Context, _ []any) (any, error) {
		return !c.Cancelled && c.status() == "success", nil
	}},
	"failure": {max: 0, status: true, call: func(c *Context, _ []any) (any, error) {
		return !c.Cancelled && c.status() == "failure", nil
	}},
	"always": {max: 0, status: true, call: func(*Context, []any) (any, error) {
		return true, nil
	}},
	"cancelled": {max: 0, status: true, call: func(c *Context, _ []any) (any, error) {
		return c.Cancelled, nil
	}},
}

func bounded(s string) (any, error) {
	if len(s) > bounds.WorkflowValue {
		return nil, fmt.Errorf("the value is over %d bytes", bounds.WorkflowValue)
	}
	return s, nil
}

// contains(search, item): an array holds an element equal to item (==);
// anything else is a string (ToString) that holds item's, ignoring case.
func contains(_ *Context, a []any) (any, error) {
	if arr, ok := a[0].([]any); ok {
		for _, e := range arr {
			if Equal(e, a[1]) {
				return true, nil
			}
		}
		return false, nil
	}
	return strings.Contains(strings.ToUpper(ToString(a[0])), strings.ToUpper(ToString(a[1]))), nil
}

// stringPredicate makes startsWith and endsWith: both strings, ignoring
// case; an array or object is never a match.
func stringPredicate(f func(s, affix string) bool) func(*Context, []any) (any, error) {
	return func(_ *Context, a []any) (any, error) {
		if !primitive(a[0]) || !primitive(a[1]) {
			return false, nil
		}
		return f(strings.ToUpper(ToString(a[0])), strings.ToUpper(ToString(a[1]))), nil
	}
}

func primitive(v any) bool {
	k := kindOf(v)
	return k != kindArray && k != kindObject
}

// format('{0} {1}', a, b): {N} is argument N's string; {{ and }} are
// literal braces; anything else between braces is an error, as GitHub's.
func format(_ *Context, a []any) (any, error) {
	f := ToString(a[0])
	args := a[1:]
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		c := f[i]
		switch {
		case c == '{' && i+1 < len(f) && f[i+1] == '{':
			b.WriteByte('{')
			i++
		case c == '}' && i+1 < len(f) && f[i+1] == '}':
			b.WriteByte('}')
			i++
		case c == '{':
			end := strings.IndexByte(f[i:], '}')
			if end < 0 {
				return nil, fmt.Errorf("format: %q has a '{' that is not closed", bounds.Truncate(f, bounds.Quoted))
			}
			n, err := strconv.Atoi(f[i+1 : i+end])
			if err != nil || n < 0 || f[i+1] == '+' {
				return nil, fmt.Errorf("format: %q has {%s}, which is not an argument index", bounds.Truncate(f, bounds.Quoted), bounds.Truncate(f[i+1:i+end], bounds.Quoted))
			}
			if n >= len(args) {
				return nil, fmt.Errorf("format: %q names argument {%d}, but %d were given", bounds.Truncate(f, bounds.Quoted), n, len(args))
			}
			b.WriteString(ToString(args[n]))
			i += end
		case c == '}':
			return nil, fmt.Errorf("format: %q has a '}' that no '{' opens", bounds.Truncate(f, bounds.Quoted))
		default:
			b.WriteByte(c)
		}
		if b.Len() > bounds.WorkflowValue {
			return nil, fmt.Errorf("format: the value is over %d bytes", bounds.WorkflowValue)
		}
	}
	return b.String(), nil
}

// join(array, sep=','): the elements' strings joined; a value that is not
// an array is its own string.
func join(_ *Context, a []any) (any, error) {
	sep := ","
	if len(a) > 1 {
		sep = ToString(a[1])
	}
	arr, ok := a[0].([]any)
	if !ok {
		if !primitive(a[0]) {
			return "", nil
		}
		return ToString(a[0]), nil
	}
	var b strings.Builder
	for i, e := range arr {
		if i > 0 {
			b.WriteString(sep)
		}
		if primitive(e) {
			b.WriteString(ToString(e))
		}
		if b.Len() > bounds.WorkflowValue {
			return nil, fmt.Errorf("join: the value is over %d bytes", bounds.WorkflowValue)
		}
	}
	return b.String(), nil
}

// hashFiles(patterns...) asks the Context's HashFiles for the digest of
// the files the patterns name (GitHub's arguments, joined by newlines as
// its runner joins them).
func hashFiles(c *Context, a []any) (any, error) {
	patterns, err := HashFilesPatterns(a)
	if err != nil {
		return nil, err
	}
	if c.HashFiles == nil {
		return nil, errors.New("hashFiles is only available in a step's if, run, env and with")
	}
	return c.HashFiles(patterns)
}

// HashFilesPatterns is one hashFiles call's patterns from its arguments,
// as GitHub's runner reads them: a first argument starting with "--" is
// an option (only --follow-symbolic-links exists, which Stoke refuses: a
// link is never followed out of the workspace), the others joined by
// newlines, within bounds.HashFilesPatterns and bounds.HashFilesPattern.
func HashFilesPatterns(a []any) (string, error) {
	ps := make([]string, 0, len(a))
	for i, v := range a {
		s := ToString(v)
		if i == 0 && strings.HasPrefix(s, "--") {
			if strings.EqualFold(s, "--follow-symbolic-links") {
				return "", errors.New("hashFiles: --follow-symbolic-links is not supported: symbolic links inside the workspace are read, and none is followed out of it")
			}
			return "", fmt.Errorf("hashFiles: invalid glob option %s; the one option is --follow-symbolic-links", bounds.Quote(s))
		}
		ps = append(ps, s)
	}
	joined := strings.Join(ps, "\n")
	if n := strings.Count(joined, "\n") + 1; n > bounds.HashFilesPatterns {
		return "", fmt.Errorf("hashFiles: %d patterns, at most %d allowed", n, bounds.HashFilesPatterns)
	}
	if len(joined) > bounds.HashFilesPatterns*bounds.HashFilesPattern {
		return "", fmt.Errorf("hashFiles: the patterns are over %d bytes", bounds.HashFilesPatterns*bounds.HashFilesPattern)
	}
	return joined, nil
}
