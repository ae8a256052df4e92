package workflow

import (
	"fmt"
	"slices"
	"testing"
)

func TestRewriteScript(t *testing.T) {
	for _, tc := range []struct {
		in, shell, want string
		vars            []string
		err             bool
	}{
		{in: "echo hi", shell: "bash", want: "echo hi"},
		{in: `echo "${{ matrix.os }}" && echo ${{inputs.x}}`, shell: "bash",
			want: `echo "${STOKE_EXPR_0}" && echo ${STOKE_EXPR_1}`, vars: []string{"STOKE_EXPR_0", "STOKE_EXPR_1"}},
		// '}}' inside a string literal does not end the expression.
		{in: `x=${{ format('{0}}}', 'a') }}`, shell: "sh", want: `x=${STOKE_EXPR_0}`, vars: []string{"STOKE_EXPR_0"}},
		{in: "echo ${{ a", shell: "bash", err: true},
		{in: `print("${{ a }}")`, shell: "python", err: true},
		{in: `print("plain")`, shell: "python", want: `print("plain")`},
	} {
		got, exprs, err := rewriteScript(tc.in, tc.shell)
		if (err != nil) != tc.err {
			t.Errorf("%q: error %v, want error %v", tc.in, err, tc.err)
			continue
		}
		var vars []string
		for i := range exprs {
			vars = append(vars, fmt.Sprintf("STOKE_EXPR_%d", i))
		}
		if got != tc.want || !slices.Equal(vars, tc.vars) {
			t.Errorf("%q: got %q %v, want %q %v", tc.in, got, vars, tc.want, tc.vars)
		}
	}
}

func TestStepRunNames(t *testing.T) {
	a := stepRunName("ci", "uid-1", "Build_All", 0, 1, 3)
	if a != stepRunName("ci", "uid-1", "Build_All", 0, 1, 3) {
		t.Fatal("not deterministic")
	}
	for _, other := range []string{
		stepRunName("ci", "uid-1", "build-all", 0, 1, 3), // same slug, other id
		stepRunName("ci", "uid-2", "Build_All", 0, 1, 3),
		stepRunName("ci", "uid-1", "Build_All", 1, 1, 3),
		stepRunName("ci", "uid-1", "Build_All", 0, 2, 3),
		stepRunName("ci", "uid-1", "Build_All", 0, 1, 4),
	} {
		if other == a {
			t.Errorf("%s names two step Runs", a)
		}
	}
	long := stepRunName(string(make([]byte, 0))+"a123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789", "u", "j", 0, 1, 0)
	if len(long) > maxRunName {
		t.Errorf("%d bytes: %s", len(long), long)
	}
}
