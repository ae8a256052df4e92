package python

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/runtime"
)

func TestValidateHandler(t *testing.T) {
	a := New(Config{})
	for _, tc := range []struct {
		handler string
		ok      bool
	}{
		{"handler.handle", true},
		{"pkg.sub.module.run", true},
		{"_private.Handler_2", true},
		{"app.match", true}, // soft keywords are identifiers
		{"handle", false},
		{"", false},
		{".handle", false},
		{"handler.", false},
		{"pkg..handle", false},
		{"my-module.handle", false},
		{"1module.handle", false},
		{"handler.class", false},
		{"import.handle", false},
		{"modulé.handle", false},
		{"pkg/module.handle", false},
		{"handler.handle ", false},
	} {
		t.Run(tc.handler, func(t *testing.T) {
			err := a.ValidateHandler(tc.handler)
			if (err == nil) != tc.ok {
				t.Fatalf("ValidateHandler(%q) = %v, want ok=%v", tc.handler, err, tc.ok)
			}
		})
	}
}

func TestTaskCommand(t *testing.T) {
	a := New(Config{Interpreter: "/usr/bin/python3"})
	for _, tc := range []struct {
		name       string
		entrypoint string
		args       []string
		want       []string
	}{
		{"entrypoint", "main.py", nil, []string{"/usr/bin/python3", "main.py"}},
		{"entrypoint and args", "tools/run.py", []string{"--n", "3"}, []string{"/usr/bin/python3", "tools/run.py", "--n", "3"}},
		{"args only", "", []string{"-m", "pkg.tool"}, []string{"/usr/bin/python3", "-m", "pkg.tool"}},
		{"nothing", "", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := a.TaskCommand(tc.entrypoint, tc.args, time.Minute)
			if tc.want == nil {
				if err == nil {
					t.Fatalf("TaskCommand = %q, want an error", got)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("TaskCommand = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	if got, _ := New(Config{}).TaskCommand("x.py", nil, time.Minute); got[0] != "python3" {
		t.Fatalf("default interpreter = %q, want python3", got[0])
	}
}

func TestResolveInterpreter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := ResolveInterpreter(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(got); err != nil || fi.IsDir() {
		t.Fatalf("resolved %q is not a file: %v", got, err)
	}
	onPath, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(onPath, "/shims/") && (got == onPath || strings.Contains(got, "/shims/")) {
		t.Fatalf("python3 on PATH is the shim %s; resolved %s, want the real executable", onPath, got)
	}
	t.Logf("python3 on PATH: %s; resolved: %s", onPath, got)

	again, err := ResolveInterpreter(ctx, got)
	if err != nil || again != got {
		t.Fatalf("resolving the resolved interpreter = %q, %v; want %q", again, err, got)
	}
	for _, bad := range []string{"/nonexistent/python3", "false"} {
		if exe, err := ResolveInterpreter(ctx, bad); err == nil {
			t.Errorf("ResolveInterpreter(%q) = %q, want an error", bad, exe)
		}
	}
	cancelled, cancelNow := context.WithCancel(ctx)
	cancelNow()
	if _, err := ResolveInterpreter(cancelled, ""); !errors.Is(err, context.Canceled) {
		t.Errorf("with a cancelled context: %v, want context.Canceled", err)
	}
}

const echoHandler = "def handle(event):\n    return event\n"

func TestInvoke(t *testing.T) {
	for _, tc := range []struct {
		name    string
		files   map[string]string
		handler string
		input   string
		want    string // JSON, compared by value
		exact   bool   // and byte for byte
		outputs map[string]string
	}{
		{
			name:    "echo",
			files:   map[string]string{"handler.py": echoHandler},
			handler: "handler.handle",
			input:   `{"command":"status","n":[1,2.5,null,true,123456789012345678901234567890],"s":"é☃"}`,
			want:    `{"command":"status","n":[1,2.5,null,true,123456789012345678901234567890],"s":"é☃"}`,
			exact:   true,
		},
		{
			name: "dotted package module",
			files: map[string]string{
				"pkg/__init__.py":     "",
				"pkg/sub/__init__.py": "",
				"pkg/sub/mod.py":      "def run(event):\n    return {'module': __name__, 'got': event}\n",
			},
			handler: "pkg.sub.mod.run",
			input:   `5`,
			want:    `{"module":"pkg.sub.mod","got":5}`,
		},
		{
			name:    "namespace package module",
			files:   map[string]string{"ns/sub/mod.py": "def run(event):\n    return {'module': __name__}\n"},
			handler: "ns.sub.mod.run",
			input:   `5`,
			want:    `{"module":"ns.sub.mod"}`,
		},
		{
			name: "context",
			files: map[string]string{"handler.py": `
def handle(event, context):
    context.set_output("greeting", "hello " + event["name"])
    context.set_output("greeting", "hi " + event["name"])  # the later value wins
    context.set_output("empty", "")
    remaining = context.get_remaining_time_in_millis()
    return {"id": context.invocation_id, "run": context.run_uid,
            "remaining_ok": 20000 < remaining <= 30000}
`},
			handler: "handler.handle",
			input:   `{"name":"stoke"}`,
			want:    `{"id":"inv-1","run":"run-test","remaining_ok":true}`,
			outputs: map[string]string{"greeting": "hi stoke", "empty": ""},
		},
		{
			name: "async handler",
			files: map[string]string{"handler.py": `
import asyncio

async def handle(event, context):
    await asyncio.sleep(0.001)
    return {"async": True, "id": context.invocation_id, "event": event}
`},
			handler: "handler.handle",
			input:   `[1]`,
			want:    `{"async":true,"id":"inv-1","event":[1]}`,
		},
		{
			name: "decorated async handler",
			files: map[string]string{"handler.py": `
import functools

def traced(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)
    return wrapper

@traced
async def handle(event):
    return {"wrapped": event}
`},
			handler: "handler.handle",
			input:   `"x"`,
			want:    `{"wrapped":"x"}`,
		},
		{
			name: "callable object",
			files: map[string]string{"handler.py": `
class Handler:
    def __call__(self, event, context):
        return [event, context.run_uid]

handle = Handler()
`},
			handler: "handler.handle",
			input:   `true`,
			want:    `[true,"run-test"]`,
		},
		{
			name:    "bound method",
			files:   map[string]string{"handler.py": "class H:\n    def run(self, event):\n        return event * 2\n\nhandle = H().run\n"},
			handler: "handler.handle",
			input:   `21`,
			want:    `42`,
		},
		{
			name:    "None is null",
			files:   map[string]string{"handler.py": "def handle(event):\n    pass\n"},
			handler: "handler.handle",
			input:   `{}`,
			want:    `null`,
		},
		{
			name:    "lone surrogate is escaped",
			files:   map[string]string{"handler.py": "def handle(event):\n    return {'s': '\\ud800', 't': 'é'}\n"},
			handler: "handler.handle",
			input:   `{}`,
			want:    `{"s":"\ud800","t":"\u00e9"}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inst, rec := loadHandler(t, tc.files, tc.handler)
			for round := 0; round < 2; round++ { // a warm worker serves again
				res, err := invoke(t, inst, rec, "inv-1", tc.input)
				if err != nil {
					t.Fatalf("Invoke: %v", err)
				}
				assertJSON(t, res.Output, tc.want)
				if tc.exact && string(res.Output) != tc.want {
					t.Fatalf("output = %s, want exactly %s", res.Output, tc.want)
				}
				if !reflect.DeepEqual(res.Outputs, tc.outputs) {
					t.Fatalf("outputs = %q, want %q", res.Outputs, tc.outputs)
				}
			}
		})
	}
}

func assertJSON(t *testing.T, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("output %q is not JSON: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("bad want %q: %v", want, err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("output = %s, want %s", got, want)
	}
}

func TestInvokeFunctionError(t *testing.T) {
	for _, tc := range []struct {
		name     string
		handler  string // handler.py
		input    string
		wantType string
		wantMsg  string
		trace    []string // substrings of the stack trace
	}{
		{
			name:     "exception",
			handler:  "def inner(x):\n    raise ValueError('bad value: ' + x)\n\ndef handle(event):\n    return inner(event['v'])\n",
			input:    `{"v":"7"}`,
			wantType: "ValueError",
			wantMsg:  "bad value: 7",
			trace:    []string{`handler.py", line 2, in inner`, "in handle", "ValueError: bad value: 7"},
		},
		{
			name:     "exception class of the module",
			handler:  "class MyError(Exception):\n    pass\n\ndef handle(event):\n    raise MyError('mine')\n",
			input:    `{}`,
			wantType: "handler.MyError",
			wantMsg:  "mine",
			trace:    []string{"handler.MyError: mine"},
		},
		{
			name:     "exception class of the standard library",
			handler:  "import json\n\ndef handle(event):\n    return json.loads('{')\n",
			input:    `{}`,
			wantType: "json.decoder.JSONDecodeError",
			wantMsg:  "Expecting property name",
			trace:    []string{"in handle"},
		},
		{
			name:     "async exception",
			handler:  "async def handle(event):\n    raise KeyError('missing')\n",
			input:    `{}`,
			wantType: "KeyError",
			wantMsg:  "'missing'",
			trace:    []string{`handler.py", line 2, in handle`},
		},
		{
			name:     "result not serialisable",
			handler:  "def handle(event):\n    return {'s': {1, 2}}\n",
			input:    `{}`,
			wantType: errdefs.RuntimeInvalidOutput,
			wantMsg:  "set is not JSON serializable",
		},
		{
			name:     "NaN result",
			handler:  "def handle(event):\n    return float('nan')\n",
			input:    `{}`,
			wantType: errdefs.RuntimeInvalidOutput,
			wantMsg:  "not JSON compliant",
		},
		{
			name:     "output too large",
			handler:  "def handle(event):\n    return 'x' * (2 << 20)\n",
			input:    `{}`,
			wantType: errdefs.RuntimeOutputTooLarge,
			wantMsg:  "at most 1048576",
		},
		{
			name:     "set_output with a bad type",
			handler:  "def handle(event, context):\n    context.set_output('n', 1)\n",
			input:    `{}`,
			wantType: "TypeError",
			wantMsg:  "output value must be str, not int",
			trace:    []string{"in handle", "in set_output"},
		},
		{
			name:     "too many outputs",
			handler:  "def handle(event, context):\n    for i in range(100):\n        context.set_output(f'k{i}', 'v')\n",
			input:    `{}`,
			wantType: errdefs.RuntimeInvalidOutputs,
			wantMsg:  "100 keys",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inst, rec := loadHandler(t, map[string]string{"handler.py": tc.handler}, "handler.handle")
			for round := 0; round < 2; round++ { // an error leaves the worker usable
				_, err := invoke(t, inst, rec, "inv-err", tc.input)
				var fe *errdefs.FunctionError
				if !errors.As(err, &fe) {
					t.Fatalf("Invoke error = %v, want a FunctionError", err)
				}
				if fe.Type != tc.wantType || !strings.Contains(fe.Message, tc.wantMsg) {
					t.Fatalf("FunctionError = %q / %q, want type %q with message containing %q", fe.Type, fe.Message, tc.wantType, tc.wantMsg)
				}
				if fe.InvocationID != "inv-err" {
					t.Errorf("InvocationID = %q", fe.InvocationID)
				}
				for _, s := range tc.trace {
					if !strings.Contains(fe.StackTrace, s) {
						t.Errorf("stack trace lacks %q:\n%s", s, fe.StackTrace)
					}
				}
				// The worker's main loop and asyncio's frames are not the
				// user's business (set_output's frame is shown, as the
				// place that raised).
				for _, s := range []string{"in main", "in _guard", "asyncio"} {
					if strings.Contains(fe.StackTrace, s) {
						t.Errorf("stack trace shows %q:\n%s", s, fe.StackTrace)
					}
				}
				if isClosed(inst.Done()) {
					t.Fatal("a handler error ended the worker")
				}
			}
		})
	}
}

func TestStackTraceKeepsTheEnd(t *testing.T) {
	inst, rec := loadHandler(t, map[string]string{"handler.py": `
def recurse(n):
    if n == 0:
        raise RuntimeError("deep " + "x" * 10000)
    return recurse(n - 1)

def handle(event):
    return recurse(200)
`}, "handler.handle")
	_, err := invoke(t, inst, rec, "inv-deep", `{}`)
	var fe *errdefs.FunctionError
	if !errors.As(err, &fe) || fe.Type != "RuntimeError" {
		t.Fatalf("Invoke error = %v, want a RuntimeError", err)
	}
	if len(fe.Message) > bounds.Message || len(fe.StackTrace) > bounds.StackTrace {
		t.Fatalf("message %d bytes, stack trace %d bytes: over their bounds", len(fe.Message), len(fe.StackTrace))
	}
	if !strings.HasPrefix(fe.Message, "deep xxx") || !strings.HasSuffix(fe.StackTrace, "xxxx\n") {
		t.Fatalf("message %.20q… / stack trace …%q: want the message's start and the trace's end", fe.Message, fe.StackTrace[len(fe.StackTrace)-20:])
	}
}

func TestOutputIsLoggedNotReturned(t *testing.T) {
	inst, rec := loadHandler(t, map[string]string{"handler.py": `
import sys
print("imported")

def handle(event):
    print("hello from", event)
    print("line two")
    sys.stderr.write("a warning\n")
    return {"ok": True}
`}, "handler.handle")
	for _, id := range []string{"inv-a", "inv-b"} {
		res, err := invoke(t, inst, rec, id, `"`+id+`"`)
		if err != nil {
			t.Fatal(err)
		}
		if string(res.Output) != `{"ok":true}` {
			t.Fatalf("output = %q: print() leaked into it", res.Output)
		}
	}
	_ = inst.Close() // every line is logged once the pumps are done

	type line struct{ stream, text, invocation string }
	var got []line
	for _, stream := range []string{"stdout", "stderr"} {
		for _, r := range rec.output(stream) {
			got = append(got, line{stream, r.Attrs["line"], r.Attrs["invocation_id"]})
		}
	}
	want := []line{
		{"stdout", "imported", ""},
		{"stdout", "hello from inv-a", "inv-a"},
		{"stdout", "line two", "inv-a"},
		{"stdout", "hello from inv-b", "inv-b"},
		{"stdout", "line two", "inv-b"},
		{"stderr", "a warning", "inv-a"},
		{"stderr", "a warning", "inv-b"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("logged output:\n%q\nwant:\n%q", got, want)
	}
}

func TestOutputFloodDoesNotBlock(t *testing.T) {
	const lines = 10000
	inst, rec := loadHandler(t, map[string]string{"handler.py": fmt.Sprintf(`
import sys

def handle(event):
    if event == "flood":
        sys.stderr.write("x" * (10 << 20))  # no newline
        for i in range(%d):
            print("line", i)
    return event
`, lines)}, "handler.handle")
	res, err := invoke(t, inst, rec, "inv-flood", `"flood"`)
	if err != nil || string(res.Output) != `"flood"` {
		t.Fatalf("flooding invocation = %q, %v", res.Output, err)
	}
	res, err = invoke(t, inst, rec, "inv-next", `"quiet"`)
	if err != nil || string(res.Output) != `"quiet"` {
		t.Fatalf("next invocation = %q, %v", res.Output, err)
	}

	// Every complete line written during the invocation was logged under
	// it before Invoke returned. Only the unfinished last piece of stderr
	// (loglines holds a full piece until more data follows) waits for EOF.
	var stderrBytes, stdoutLines int
	for _, r := range rec.output("stderr") {
		if r.Attrs["invocation_id"] != "inv-flood" {
			t.Fatalf("stderr piece logged under %q", r.Attrs["invocation_id"])
		}
		if len(r.Attrs["line"]) > bounds.LogLine {
			t.Fatalf("a log line of %d bytes", len(r.Attrs["line"]))
		}
		stderrBytes += len(r.Attrs["line"])
	}
	for _, r := range rec.output("stdout") {
		if r.Attrs["invocation_id"] != "inv-flood" {
			t.Fatalf("stdout line %q logged under %q", r.Attrs["line"], r.Attrs["invocation_id"])
		}
		stdoutLines++
	}
	if stderrBytes < 10<<20-bounds.LogLine || stdoutLines != lines {
		t.Fatalf("logged %d stderr bytes and %d stdout lines, want at least %d and %d", stderrBytes, stdoutLines, 10<<20-bounds.LogLine, lines)
	}
	_ = inst.Close()
	stderrBytes = 0
	for _, r := range rec.output("stderr") {
		stderrBytes += len(r.Attrs["line"])
	}
	if stderrBytes != 10<<20 {
		t.Fatalf("logged %d stderr bytes in all, want %d", stderrBytes, 10<<20)
	}
}

func TestEnvironmentAndImports(t *testing.T) {
	t.Setenv("STOKE_PYTHON_TEST_SERVER_ONLY", "must not leak")
	interp := testInterpreter(t)
	// Modules the interpreter loads by itself here (site, .pth files) are
	// not the worker's doing.
	baseline, err := exec.Command(interp, "-s", "-c", "import sys; print(' '.join(sys.modules))").Output()
	if err != nil {
		t.Fatal(err)
	}
	preloaded := map[string]bool{}
	for _, m := range strings.Fields(string(baseline)) {
		preloaded[m] = true
	}

	dir := writeHandlers(t, map[string]string{"handler.py": `
import os, sys

def handle(event):
    return {"cwd": os.getcwd(), "path0": sys.path[0], "env": dict(os.environ),
            "argv": sys.argv, "modules": sorted(sys.modules)}
`})
	rec := newRecorder()
	spec := testSpec(t, dir, "handler.handle", rec, map[string]string{"GREETING": "hello"})
	inst := loadSpec(t, New(Config{Interpreter: interp}), spec)
	res, err := invoke(t, inst, rec, "inv-env", `{}`)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Cwd, Path0 string
		Env        map[string]string
		Argv       []string
		Modules    []string
	}
	if err := json.Unmarshal(res.Output, &got); err != nil {
		t.Fatal(err)
	}
	if got.Cwd != dir || got.Path0 != dir {
		t.Errorf("cwd %q, sys.path[0] %q; want the working directory %q", got.Cwd, got.Path0, dir)
	}
	wantEnv := map[string]string{}
	for _, kv := range spec.Env {
		k, v, _ := strings.Cut(kv, "=")
		wantEnv[k] = v
	}
	if !reflect.DeepEqual(got.Env, wantEnv) {
		t.Errorf("environment = %v, want exactly the registration's %v", got.Env, wantEnv)
	}
	if !reflect.DeepEqual(got.Argv, []string{""}) {
		t.Errorf("sys.argv = %q, want [\"\"]", got.Argv)
	}
	// Idle memory: a sync handler's worker must not carry these.
	for _, heavy := range []string{"asyncio", "inspect", "json", "traceback", "re"} {
		if !preloaded[heavy] && contains(got.Modules, heavy) {
			t.Errorf("the worker imported %s for a sync handler", heavy)
		}
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func TestLoadFailure(t *testing.T) {
	for _, tc := range []struct {
		name     string
		files    map[string]string
		handler  string
		wantType string
		wantMsg  string // in Error()
	}{
		{"missing module", nil, "nope.handle", "ModuleNotFoundError", "No module named 'nope'"},
		{"missing package", map[string]string{"pkg/__init__.py": ""}, "pkg.sub.handle", "ModuleNotFoundError", "No module named 'pkg.sub'"},
		{"syntax error", map[string]string{"handler.py": "def handle(event:\n    return event\n"}, "handler.handle", "SyntaxError", "handler.py, line 1"},
		{"missing function", map[string]string{"handler.py": echoHandler}, "handler.other", "AttributeError", "has no attribute 'other'"},
		{"not callable", map[string]string{"handler.py": "handle = 42\n"}, "handler.handle", "TypeError", "handler.handle is not callable: it is a int"},
		{"no parameters", map[string]string{"handler.py": "def handle():\n    pass\n"}, "handler.handle", "TypeError", "takes no positional argument"},
		{"exception at import", map[string]string{"handler.py": "import os\n\nraise RuntimeError('boom at import')\n"}, "handler.handle", "RuntimeError", `boom at import (at File "`},
		{"sys.exit at import", map[string]string{"handler.py": "import sys\nsys.exit(3)\n"}, "handler.handle", "SystemExit", "SystemExit: 3"},
		// A handler's module is a file of the Run's source, never one of
		// the interpreter's: os.system would run its input as a command.
		{"loaded stdlib module", nil, "os.system", "ImportError", "module 'os' is not from the Run's source"},
		{"stdlib module", nil, "json.dumps", "ImportError", "module 'json' is not from the Run's source"},
		{"stdlib package module", nil, "email.utils.quote", "ImportError", "module 'email' is not from the Run's source"},
		{"built-in module", nil, "_imp.create_builtin", "ImportError", "module '_imp' is not from the Run's source"},
		{"stdlib module beside a source", map[string]string{"handler.py": echoHandler}, "subprocess.getoutput", "ImportError", "module 'subprocess' is not from the Run's source"},
		{"shadowing a loaded module", map[string]string{"os.py": "def system(event):\n    return event\n"}, "os.system", "ImportError", "module 'os' is not from the Run's source"},
		{"stdlib module in a source package", map[string]string{"pkg/__init__.py": "", "pkg/json.py": "x = 1\n"}, "pkg.json.x", "TypeError", "not callable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder()
			spec := testSpec(t, writeHandlers(t, tc.files), tc.handler, rec, nil)
			inst, err := New(Config{Interpreter: testInterpreter(t)}).Load(context.Background(), spec)
			if err == nil {
				_ = inst.Close()
				t.Fatal("Load succeeded")
			}
			var ie *InitError
			if !errors.As(err, &ie) || ie.Type != tc.wantType || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("Load error = %v (%#v), want type %q containing %q", err, ie, tc.wantType, tc.wantMsg)
			}
			if len(err.Error()) > 2*bounds.Message {
				t.Fatalf("init error of %d bytes", len(err.Error()))
			}
		})
	}
}

func TestLoadWorkerExits(t *testing.T) {
	rec := newRecorder()
	spec := testSpec(t, writeHandlers(t, map[string]string{"handler.py": "import os\nos._exit(7)\n"}), "handler.handle", rec, nil)
	_, err := New(Config{Interpreter: testInterpreter(t)}).Load(context.Background(), spec)
	if err == nil || !strings.Contains(err.Error(), "exit status 7") {
		t.Fatalf("Load error = %v, want the exit status", err)
	}

	spec = testSpec(t, t.TempDir(), "handler.handle", rec, nil)
	if _, err := New(Config{Interpreter: "/nonexistent/python3"}).Load(context.Background(), spec); err == nil {
		t.Fatal("Load with a missing interpreter succeeded")
	}
}

func TestLoadContextEnds(t *testing.T) {
	rec := newRecorder()
	spec := testSpec(t, writeHandlers(t, map[string]string{"handler.py": `
import os, time
print("importing", os.getpid(), flush=True)
time.sleep(60)
`}), "handler.handle", rec, nil)
	importing := rec.await("importing")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	interpreter := testInterpreter(t) // may call t.Fatal: not in the goroutine
	go func() {
		inst, err := New(Config{Interpreter: interpreter}).Load(ctx, spec)
		if err == nil {
			_ = inst.Close()
		}
		errc <- err
	}()
	line := <-importing
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Load error = %v, want context.Canceled", err)
	}
	var pid int
	if _, err := fmt.Sscanf(line, "importing %d", &pid); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid, 5*time.Second)
}

func TestInvokeContextEnds(t *testing.T) {
	const handler = `
import os, subprocess, time

def handle(event):
    child = subprocess.Popen(["sleep", "60"])
    print("started", os.getpid(), child.pid, flush=True)
    time.sleep(60)
`
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"cancel", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }, context.Canceled},
		{"timeout", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 300*time.Millisecond)
		}, context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inst, rec := loadHandler(t, map[string]string{"handler.py": handler}, "handler.handle")
			started := rec.await("started")
			ctx, cancel := tc.ctx()
			defer cancel()
			errc := make(chan error, 1)
			go func() {
				_, err := invokeCtx(ctx, inst, rec, "inv-slow", `{}`)
				errc <- err
			}()
			var line string
			if tc.want == context.Canceled {
				line = <-started
				cancel()
			}
			if err := <-errc; !errors.Is(err, tc.want) {
				t.Fatalf("Invoke error = %v, want %v", err, tc.want)
			}
			if !isClosed(inst.Done()) {
				t.Fatal("Done is open after the context ended")
			}
			waitGone(t, inst.p.Pid(), 5*time.Second)
			if tc.want == context.Canceled {
				var worker, child int
				if _, err := fmt.Sscanf(line, "started %d %d", &worker, &child); err != nil {
					t.Fatal(err)
				}
				waitGone(t, child, 5*time.Second) // the whole group went
			}
			if _, err := invoke(t, inst, rec, "inv-after", `{}`); !errors.Is(err, errdefs.ErrUnavailable) {
				t.Fatalf("Invoke on a killed worker = %v, want Unavailable", err)
			}
		})
	}
}

// The core replaces an instance whose Done closed with a new Load: the same
// spec must load again and serve.
func TestReplacementAfterTimeout(t *testing.T) {
	rec := newRecorder()
	dir := writeHandlers(t, map[string]string{"handler.py": "import time\n\ndef handle(event):\n    if event == 'slow':\n        time.sleep(60)\n    return event\n"})
	a := New(Config{Interpreter: testInterpreter(t)})
	spec := testSpec(t, dir, "handler.handle", rec, nil)
	first := loadSpec(t, a, spec)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := invokeCtx(ctx, first, rec, "inv-slow", `"slow"`); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("slow invocation = %v", err)
	}
	<-first.Done()
	second := loadSpec(t, a, spec)
	if res, err := invoke(t, second, rec, "inv-fast", `"fast"`); err != nil || string(res.Output) != `"fast"` {
		t.Fatalf("replacement = %q, %v", res.Output, err)
	}
}

func TestWorkerExitDuringInvocation(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string
	}{
		{"os._exit", "os._exit(3)", "exit status 3"},
		{"sys.exit", "sys.exit(4)", "exit status 4"},
		{"segfault", "os.kill(os.getpid(), signal.SIGSEGV)", "segmentation fault"},
		{"killed", "os.kill(os.getpid(), signal.SIGKILL)", "signal: killed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inst, rec := loadHandler(t, map[string]string{"handler.py": "import os, signal, sys\n\ndef handle(event):\n    print('about to die', flush=True)\n    " + tc.body + "\n"}, "handler.handle")
			_, err := invoke(t, inst, rec, "inv-exit", `{}`)
			var fe *errdefs.FunctionError
			if !errors.As(err, &fe) || fe.Type != errdefs.RuntimeExitError || !strings.Contains(fe.Message, tc.want) {
				t.Fatalf("Invoke error = %v, want Runtime.ExitError with %q", err, tc.want)
			}
			if !isClosed(inst.Done()) {
				t.Fatal("Done is open after the worker exited")
			}
		})
	}
}

func TestHandlerBreaksTheProtocol(t *testing.T) {
	inst, rec := loadHandler(t, map[string]string{"handler.py": `
import os

def handle(event):
    os.write(4, b"\xff\xff\xff\xff\x01")  # a 4 GiB response
    return event
`}, "handler.handle")
	_, err := invoke(t, inst, rec, "inv-garbage", `{}`)
	var fe *errdefs.FunctionError
	if !errors.As(err, &fe) || fe.Type != errdefs.RuntimeProtocolError {
		t.Fatalf("Invoke error = %v, want Runtime.ProtocolError", err)
	}
	if !isClosed(inst.Done()) {
		t.Fatal("Done is open after the worker was stopped")
	}
}

// A descendant that escaped the process group (setsid) keeps the output
// pipes open; Close still returns and leaves no goroutine behind.
func TestCloseWithEscapedDescendant(t *testing.T) {
	inst, rec := loadHandler(t, map[string]string{"handler.py": `
import subprocess

def handle(event):
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    print("escaped", child.pid)
    return child.pid
`}, "handler.handle")
	res, err := invoke(t, inst, rec, "inv-escape", `{}`)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := json.Unmarshal(res.Output, &pid); err != nil || pid <= 0 {
		t.Fatalf("output %q: %v", res.Output, err)
	}
	defer func() { _ = syscall.Kill(pid, syscall.SIGKILL) }()
	start := time.Now()
	_ = inst.Close()
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Close took %s", d)
	}
}

func TestWorkerDiesWhileIdle(t *testing.T) {
	inst, rec := loadHandler(t, map[string]string{"handler.py": echoHandler}, "handler.handle")
	if err := syscall.Kill(inst.p.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-inst.Done()
	if _, err := invoke(t, inst, rec, "inv-dead", `{}`); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Invoke on a dead worker = %v, want Unavailable", err)
	}
}

func TestClose(t *testing.T) {
	inst, rec := loadHandler(t, map[string]string{"handler.py": echoHandler}, "handler.handle")
	if _, err := invoke(t, inst, rec, "inv-1", `1`); err != nil {
		t.Fatal(err)
	}
	pid := inst.p.Pid()
	for range 2 {
		if err := inst.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
	if !isClosed(inst.Done()) {
		t.Fatal("Done is open after Close")
	}
	waitGone(t, pid, 5*time.Second)
	if _, err := invoke(t, inst, rec, "inv-2", `1`); err == nil {
		t.Fatal("Invoke after Close succeeded")
	}
}

func TestInvokeWithEndedContext(t *testing.T) {
	inst, rec := loadHandler(t, map[string]string{"handler.py": echoHandler}, "handler.handle")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := invokeCtx(ctx, inst, rec, "inv-late", `1`); !errors.Is(err, context.Canceled) {
		t.Fatalf("Invoke = %v, want context.Canceled", err)
	}
	// Nothing was sent, so the worker is still good.
	if res, err := invoke(t, inst, rec, "inv-ok", `1`); err != nil || !bytes.Equal(res.Output, []byte("1")) {
		t.Fatalf("Invoke = %q, %v", res.Output, err)
	}
}

func TestLargeInput(t *testing.T) {
	inst, rec := loadHandler(t, map[string]string{"handler.py": "def handle(event):\n    return len(event)\n"}, "handler.handle")
	input := `"` + strings.Repeat("y", bounds.InvokeBody-2) + `"`
	res, err := invoke(t, inst, rec, "inv-big", input)
	if err != nil || string(res.Output) != fmt.Sprint(bounds.InvokeBody-2) {
		t.Fatalf("Invoke = %q, %v", res.Output, err)
	}
}

// The adapter satisfies the core's contract end to end.
var _ runtime.Adapter = New(Config{})
