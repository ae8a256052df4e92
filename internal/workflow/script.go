package workflow

import (
	"errors"
	"fmt"
	"strings"

	"stoke.dev/stoke/internal/wfexpr"
)

// exprEnvPrefix names the environment variables that carry the values of
// the ${{ }} expressions of a step's script.
const exprEnvPrefix = "STOKE_EXPR_"

// rewriteScript replaces each ${{ expr }} in a step's script by a
// reference to the environment variable STOKE_EXPR_<n> that will hold its
// value, and returns the expressions in order: the value never becomes
// source. bash and sh expand "${STOKE_EXPR_n}" (inside single quotes it
// stays literal, where GitHub would have spliced the text in). A python
// script has no reference that works both inside and outside a string
// literal, so it may not hold ${{ }}: its step passes values through env:
// and reads os.environ.
func rewriteScript(script, shell string) (string, []*wfexpr.Expr, error) {
	t, err := wfexpr.ParseTemplate(script)
	if err != nil {
		return "", nil, fmt.Errorf("run: %w", err)
	}
	exprs := t.Expressions()
	if len(exprs) == 0 {
		return script, nil, nil
	}
	if shell == "python" {
		return "", nil, errors.New("a python step's run may not hold ${{ }}: pass the value in the step's env and read os.environ")
	}
	var b strings.Builder
	for i, lit := range t.Literals() {
		b.WriteString(lit)
		if i < len(exprs) {
			fmt.Fprintf(&b, "${%s%d}", exprEnvPrefix, i)
		}
	}
	return b.String(), exprs, nil
}
