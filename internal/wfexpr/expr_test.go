package wfexpr

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

// ctx is the Context every table case below evaluates in.
func testContext() *Context {
	m := NewObject()
	m.Set("os", "linux")
	m.Set("node", 16.0)
	return &Context{
		Workflow:  WorkflowInfo{Name: "ci", RunID: "ci-7f3a", Attempt: 2},
		Workspace: "/ws",
		Env:       map[string]string{"GREETING": "hello", "EMPTY": ""},
		Inputs:    map[string]any{"n": 3.0, "flag": true, "name": "World"},
		Matrix:    m,
		Needs: map[string]JobResult{
			"build": {Result: "success", Outputs: map[string]string{"Version": "1.2.3", "list": `["a","b"]`}},
		},
		Steps: map[string]StepResult{
			"s1": {Outcome: "failure", Conclusion: "success", Outputs: map[string]string{"k": "v"}},
		},
		Jobs: map[string]JobResult{"test": {Result: "success", Outputs: map[string]string{"report": "ok"}}},
	}
}

// The cases follow GitHub's documentation of expressions (operators,
// literals, coercion, functions, object filters) and actions/runner's
// evaluator where the documentation is silent.
var evalCases = []struct {
	expr string
	want string // toJSON of the value, compact
}{
	// Literals.
	{"null", "null"},
	{"true", "true"},
	{"711", "711"},
	{"-9.2", "-9.2"},
	{"0xff", "255"},
	{"-2.99e-2", "-0.0299"},
	{"'Mona''s'", `"Mona's"`},

	// Loose equality: numbers and strings compare as numbers; booleans
	// and null become numbers; strings ignore case; NaN equals nothing.
	{"null == 0", "true"},
	{"'' == 0", "true"},
	{"'' == null", "true"},
	{"1 == '1'", "true"},
	{"'1.0' == 1", "true"},
	{"' 3 ' == 3", "true"},
	{"'0x10' == 16", "true"},
	{"'abc' == 'ABC'", "true"},
	{"'abc' != 'ABC'", "false"},
	{"true == 1", "true"},
	{"false == 0", "true"},
	{"true == 'true'", "false"},
	{"'abc' == 0", "false"},
	{"fromJSON('[]') == fromJSON('[]')", "false"},
	{"fromJSON('{}') == 0", "false"},
	{"env == env", "true"},
	{"fromJSON('\"NaN\"') == fromJSON('\"NaN\"')", "true"}, // two strings
	{"'NaN' == 'NaN'", "true"},
	{"'x' == fromJSON('1')", "false"},

	// Relations: after coercion; strings ignore case; NaN compares false.
	{"1 < 2", "true"},
	{"1 < '2'", "true"},
	{"'a' < 'B'", "true"},
	{"'B' > 'a'", "true"},
	{"'abc' < 1", "false"},
	{"'abc' >= 1", "false"},
	{"false < true", "true"},
	{"null < 1", "true"},
	{"2 <= 2", "true"},
	{"3 >= '4'", "false"},

	// Truthiness, and && and || giving an operand.
	{"!''", "true"},
	{"!0", "true"},
	{"!'0'", "false"},
	{"!'false'", "false"},
	{"!null", "true"},
	{"!fromJSON('{}')", "false"},
	{"!fromJSON('[]')", "false"},
	{"'' || 'default'", `"default"`},
	{"'a' && 'b'", `"b"`},
	{"0 && fromJSON('{')", "0"}, // the right operand is not evaluated
	{"inputs.name || 'x'", `"World"`},
	{"(1 == 1) && (2 > 1 || false)", "true"},

	// Contexts, properties ignoring case.
	{"env.greeting", `"hello"`},
	{"ENV.Greeting", `"hello"`},
	{"env['GREETING']", `"hello"`},
	{"env.missing", "null"},
	{"env.missing.deeper", "null"},
	{"inputs.n", "3"},
	{"inputs.n + 1", ""}, // no arithmetic in GitHub's language: see parseErrors
	{"inputs.flag", "true"},
	{"matrix.os", `"linux"`},
	{"matrix.node", "16"},
	{"needs.build.outputs.version", `"1.2.3"`},
	{"needs.BUILD.result", `"success"`},
	{"fromJSON(needs.build.outputs.list)[1]", `"b"`},
	{"steps.s1.outputs.k", `"v"`},
	{"steps.s1.outcome", `"failure"`},
	{"steps.s1.conclusion", `"success"`},
	{"job.status", `"success"`},
	{"jobs.test.outputs.report", `"ok"`},
	{"workflow.name", `"ci"`},
	{"workflow.runId", `"ci-7f3a"`},
	{"workflow.attempt", "2"},
	{"github.run_id", `"ci-7f3a"`},
	{"github.run_attempt", `"2"`},
	{"github.workflow", `"ci"`},
	{"github.workspace", `"/ws"`},
	{"runner.os", `"Linux"`},

	// Indexes: arrays by number (floored; a numeric string works),
	// objects by string ignoring case; anything else is null.
	{"fromJSON('[10,20]')[1]", "20"},
	{"fromJSON('[10,20]')['1']", "20"},
	{"fromJSON('[10,20]')[1.7]", "20"},
	{"fromJSON('[10,20]')[5]", "null"},
	{"fromJSON('[10,20]')[-1]", "null"},
	{"fromJSON('{\"Key\":1}').KEY", "1"},
	{"fromJSON('{\"Key\":1}')['kEy']", "1"},
	{"'abc'.length", "null"},

	// Object filters.
	{"fromJSON('[{\"n\":1},{\"n\":2},{\"m\":3}]').*.n", "[1,2]"},
	{"fromJSON('{\"a\":{\"x\":1},\"b\":{\"x\":2}}').*.x", "[1,2]"},
	{"fromJSON('[[1,2],[3]]').*.*", "[1,2,3]"},
	{"contains(fromJSON('[{\"n\":1},{\"n\":2}]').*.n, 2)", "true"},
	{"fromJSON('[{\"a\":[{\"b\":1}]},{\"a\":[{\"b\":2}]}]').*.a.*.b", "[1,2]"},
	{"fromJSON('5').*", "[]"},

	// Functions.
	{"contains('Hello world', 'WORLD')", "true"},
	{"contains('Hello', 'x')", "false"},
	{"contains(fromJSON('[\"a\",\"B\"]'), 'b')", "true"},
	{"contains(fromJSON('[1,2]'), '2')", "true"},
	{"contains(fromJSON('[1,2]'), 3)", "false"},
	{"contains(12345, 34)", "true"},
	{"startsWith('Hello world', 'he')", "true"},
	{"startsWith('Hello', 'lo')", "false"},
	{"endsWith('Hello', 'LO')", "true"},
	{"endsWith(fromJSON('[\"lo\"]'), 'lo')", "false"},
	{"format('Hello {0} {1} {2}', 'Mona', 'the', 'Octocat')", `"Hello Mona the Octocat"`},
	{"format('{{Hello {0} {1} {2}!}}', 'Mona', 'the', 'Octocat')", `"{Hello Mona the Octocat!}"`},
	{"format('{0}{1}{0}', 'a', 'b')", `"aba"`},
	{"format('{0}', 3.0)", `"3"`},
	{"format('{0}', 0.1)", `"0.1"`},
	{"format('{0}', 1.5e21)", `"1.5E+21"`},
	{"format('{0}', 1.23456789012345678e17)", `"1.23456789012346E+17"`},
	{"format('{0}', true)", `"true"`},
	{"format('{0}|', null)", `"|"`},
	{"format('{0}', fromJSON('[1]'))", `"Array"`},
	{"format('{0}', env)", `"Object"`},
	{"format('{0}', fromJSON('\"x\"') == 'X')", `"true"`},
	{"join(fromJSON('[\"a\",\"b\",\"c\"]'))", `"a,b,c"`},
	{"join(fromJSON('[\"a\",1,true,null]'), ', ')", `"a, 1, true, "`},
	{"join('solo', '-')", `"solo"`},
	{"join(fromJSON('{\"a\":1}'))", `""`},
	{"toJSON('x')", `"\"x\""`},
	{"toJSON(1)", `"1"`},
	{"toJSON(fromJSON('{\"b\":1,\"a\":[true,null,\"<x>\"]}'))", `"{\n  \"b\": 1,\n  \"a\": [\n    true,\n    null,\n    \"<x>\"\n  ]\n}"`},
	{"toJSON(fromJSON('[]'))", `"[]"`},
	{"toJSON(matrix)", `"{\n  \"os\": \"linux\",\n  \"node\": 16\n}"`},
	{"fromJSON('3')", "3"},
	{"fromJSON('true')", "true"},
	{"fromJSON(' {\"a\": {\"b\": [1, 2.5]}} ').a.b[1]", "2.5"},
	{"fromJSON(toJSON(fromJSON('{\"z\":1,\"y\":{\"x\":[1,\"2\"]}}'))).y.x[1]", `"2"`},
	{"ALWAYS()", "true"},
	{"success()", "true"},
	{"failure()", "false"},
	{"cancelled()", "false"},
}

func TestEval(t *testing.T) {
	for _, tt := range evalCases {
		t.Run(tt.expr, func(t *testing.T) {
			e, err := Parse(tt.expr)
			if tt.want == "" {
				if err == nil {
					t.Fatalf("parsed; want a parse error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c := testContext()
			v, err := e.Eval(c)
			if err != nil {
				t.Fatal(err)
			}
			if got := ToJSON(v, false); got != tt.want {
				t.Fatalf("got %s, want %s", got, tt.want)
			}
		})
	}
}

// GitHub's toJSON and fromJSON round-trip: the same text, key order kept.
func TestJSONRoundTrip(t *testing.T) {
	for _, text := range []string{
		`{"z":1,"a":{"y":[1,2.5,-3,"x",true,false,null,{}],"b":[]},"é":"ü <&>"}`,
		`[1,"two",[3]]`,
		`"s"`, `0`, `1e+21`, `null`,
	} {
		v, err := ParseJSON(text)
		if err != nil {
			t.Fatal(err)
		}
		pretty := ToJSON(v, true)
		again, err := ParseJSON(pretty)
		if err != nil {
			t.Fatal(err)
		}
		if got := ToJSON(again, true); got != pretty {
			t.Errorf("%s: round trip %s, then %s", text, pretty, got)
		}
	}
	for _, bad := range []string{``, `{`, `[1,]`, `{"a":1} x`, `NaN`} {
		if _, err := ParseJSON(bad); err == nil {
			t.Errorf("ParseJSON(%q) succeeded", bad)
		}
	}
}

func TestCoercions(t *testing.T) {
	for in, want := range map[string]float64{"": 0, " 12 ": 12, "1e3": 1000, "-1.5": -1.5, "0x1F": 31, "0o17": 15, "Infinity": math.Inf(1), "-Infinity": math.Inf(-1)} {
		if got := ToNumber(in); got != want {
			t.Errorf("ToNumber(%q) = %v, want %v", in, got, want)
		}
	}
	for _, in := range []string{"abc", "1_000", "inf", "0x", "1e", ".", "0x1p3", "12abc"} {
		if got := ToNumber(in); !math.IsNaN(got) {
			t.Errorf("ToNumber(%q) = %v, want NaN", in, got)
		}
	}
	if ToString(math.NaN()) != "NaN" || ToString(math.Inf(-1)) != "-Infinity" || ToString(-0.5) != "-0.5" || ToString(1e-7) != "1E-07" {
		t.Errorf("number strings: %s %s %s %s", ToString(math.NaN()), ToString(math.Inf(-1)), ToString(-0.5), ToString(1e-7))
	}
}

// Templates: literal text around expressions; one expression alone keeps
// its type; '}}' in a string literal does not end the expression.
func TestTemplate(t *testing.T) {
	c := testContext()
	for in, want := range map[string]string{
		"plain":                                `"plain"`,
		"a-${{ matrix.os }}-b":                 `"a-linux-b"`,
		"${{ matrix.node }}":                   `16`,
		" ${{ matrix.node }}":                  `" 16"`,
		"${{ fromJSON('[1]') }}":               `[1]`,
		"${{ '}}' }}":                          `"}}"`,
		"${{ format('{0}}}', 'a') }}!":         `"a}!"`,
		"${{ 1 }}${{ 2 }}":                     `"12"`,
		"x ${{ env }} y":                       `"x Object y"`,
		"${{ inputs.name }} ${{ job.status }}": `"World success"`,
	} {
		tmpl, err := ParseTemplate(in)
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		v, err := tmpl.Eval(c)
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if got := ToJSON(v, false); got != want {
			t.Errorf("%q: got %s, want %s", in, got, want)
		}
	}
}

// An if: that calls no status function is success() && (it).
func TestEvalIf(t *testing.T) {
	for _, tt := range []struct {
		expr      string
		status    string
		cancelled bool
		want      bool
	}{
		{"", "", false, true},
		{"", "failure", false, false},
		{"true", "failure", false, false},
		{"${{ true }}", "failure", false, false},
		{"always()", "failure", false, true},
		{"${{ always() }}", "", true, true},
		{"failure()", "failure", false, true},
		{"failure()", "", false, false},
		{"success()", "", true, false},
		{"cancelled()", "", true, true},
		{"", "", true, false},
		{"always() && matrix.os == 'linux'", "failure", false, true},
		{"failure() || matrix.os == 'mac'", "", false, false},
		{"matrix.os == 'LINUX'", "", false, true},
		{"${{ matrix.os == 'linux' }}", "", false, true},
		{"github.run_attempt > 1", "", false, true},
	} {
		c := testContext()
		c.Status, c.Cancelled = tt.status, tt.cancelled
		got, err := EvalIf(tt.expr, c)
		if err != nil {
			t.Fatalf("%q: %v", tt.expr, err)
		}
		if got != tt.want {
			t.Errorf("if %q (status %q, cancelled %v) = %v, want %v", tt.expr, tt.status, tt.cancelled, got, tt.want)
		}
	}
}

// What does not parse, or names what is not there, is refused at parse
// with where and why.
func TestParseErrors(t *testing.T) {
	for in, want := range map[string]string{
		"a ==":                    "unexpected end of input",
		"foo.bar":                 `unknown context "foo"`,
		"secrets.token":           `unknown context "secrets"`,
		"nope()":                  `unknown function "nope"`,
		"hashFiles()":             "hashFiles takes at least 1 arguments, not 0",
		"contains('a')":           "contains takes 2 arguments, not 1",
		"success(1)":              "success takes 0 arguments, not 1",
		"1 2":                     "did not reach end of input",
		"inputs.n + 1":            "unexpected character '+'",
		"":                        "is empty",
		"'open":                   "end of string literal",
		strings.Repeat("a", 5000): "is over 4096 bytes",
	} {
		_, err := Parse(in)
		var pe *Error
		if !errors.As(err, &pe) || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%.20q) = %v, want an *Error with %q", in, err, want)
		}
	}
	for in, want := range map[string]string{
		"echo ${{ matrix.os":     "unexpected EOF",
		"ok ${{ 1 }} ${{ x.y }}": `at offset 16: unknown context "x"`,
		"${{ }}":                 "unexpected end",
	} {
		err := Check(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Check(%q) = %v, want %q", in, err, want)
		}
	}
}

func TestEvalErrors(t *testing.T) {
	c := testContext()
	for in, want := range map[string]string{
		"format('{1}', 'a')": "names argument {1}, but 1 were given",
		"format('{', 'a')":   "not closed",
		"format('}', 'a')":   "that no '{' opens",
		"format('{x}', 'a')": "not an argument index",
		"fromJSON('{')":      "fromJSON: invalid JSON",
		"format('{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}', format('{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}', format('{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}{0}', 'abcdefghijklmnop')))": "over 65536 bytes",
	} {
		e, err := Parse(in)
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		_, err = e.Eval(c)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Eval(%q) = %v, want %q", in, err, want)
		}
	}
}

// hashFiles is answered by the Context's HashFiles, with the arguments'
// patterns joined by newlines; HashFilesCalls finds every call's patterns
// ahead, on every branch, so that one hash Run answers them all.
func TestHashFiles(t *testing.T) {
	c := testContext()
	asked := map[string]int{}
	c.HashFiles = func(p string) (string, error) {
		asked[p]++
		if p == "none" {
			return "", nil
		}
		return "h(" + p + ")", nil
	}
	tmpl, err := ParseTemplate("k-${{ hashFiles('**/go.sum', format('{0}/x', matrix.os)) }}-${{ hashFiles('none') || hashFiles('b') }}")
	if err != nil {
		t.Fatal(err)
	}
	if !tmpl.CallsHashFiles() {
		t.Error("CallsHashFiles = false")
	}
	calls := tmpl.HashFilesCalls(c)
	if want := []string{"**/go.sum\nlinux/x", "none", "b"}; !slices.Equal(calls, want) {
		t.Errorf("HashFilesCalls = %q, want %q", calls, want)
	}
	got, err := tmpl.EvalString(c)
	if err != nil || got != "k-h(**/go.sum\nlinux/x)-h(b)" {
		t.Errorf("EvalString = %q, %v", got, err)
	}
	e, err := Parse("success() && hashFiles('none') != ''")
	if err != nil || !e.CallsHashFiles() {
		t.Fatalf("Parse: %v, calls %v", err, e.CallsHashFiles())
	}
	if ok, err := e.EvalIf(c); ok || err != nil {
		t.Errorf("if over an empty hash = %v, %v", ok, err)
	}
	if t2, _ := ParseTemplate("${{ format('{0}', 1) }}"); t2.CallsHashFiles() || t2.HashFilesCalls(c) != nil {
		t.Error("a template without hashFiles says it calls it")
	}
	for in, want := range map[string]string{
		"hashFiles('--follow-symbolic-links', '**')":        "--follow-symbolic-links is not supported",
		"hashFiles('--other', '**')":                        "invalid glob option",
		"hashFiles('a'" + strings.Repeat(", 'a'", 64) + ")": "65 patterns, at most 64",
	} {
		e, err := Parse(in)
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if _, err := e.Eval(c); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Eval(%.50q) = %v, want %q", in, err, want)
		}
	}
	c.HashFiles = nil
	if _, err := EvalString("${{ hashFiles('x') }}", c); err == nil || !strings.Contains(err.Error(), "only available in a step's") {
		t.Errorf("hashFiles without a workspace: %v", err)
	}
}
