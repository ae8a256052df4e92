package bash

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/runtime"
)

// invokeTimeout bounds invocations expected to finish; generous, because
// the race detector and a busy machine slow bash and Go alike.
const invokeTimeout = 20 * time.Second

func TestValidateHandler(t *testing.T) {
	tests := []struct {
		handler string
		file    string
		fn      string
		wantErr string
	}{
		{handler: "handler.handle", file: "handler.sh", fn: "handle"},
		{handler: "lib/fns.echo", file: "lib/fns.sh", fn: "echo"},
		{handler: "lib.v2/fns.echo", file: "lib.v2/fns.sh", fn: "echo"},
		{handler: "./handler._h1", file: "./handler.sh", fn: "_h1"},
		{handler: "handler.sh.main", file: "handler.sh.sh", fn: "main"},
		{handler: "handler", wantErr: "file.function"},
		{handler: "handler.", wantErr: "function name"},
		{handler: "handler.1abc", wantErr: "function name"},
		{handler: "handler.a-b", wantErr: "function name"},
		{handler: "handler.a b", wantErr: "function name"},
		{handler: "handler.$(id)", wantErr: "function name"},
		{handler: ".handle", wantErr: "no file name"},
		{handler: "/etc/passwd.x", wantErr: "relative"},
		{handler: "../up.handle", wantErr: "'..'"},
		{handler: "a/../../up.handle", wantErr: "'..'"},
		{handler: "lib/.handle", wantErr: "directory"},
		{handler: "a\x00b.handle", wantErr: "NUL"},
	}
	a := New(Config{})
	for _, tt := range tests {
		t.Run(tt.handler, func(t *testing.T) {
			err := a.ValidateHandler(tt.handler)
			file, fn, perr := parseHandler(tt.handler)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ValidateHandler(%q) = %v, want an error containing %q", tt.handler, err, tt.wantErr)
				}
				return
			}
			if err != nil || perr != nil {
				t.Fatalf("ValidateHandler(%q) = %v", tt.handler, err)
			}
			if file != tt.file || fn != tt.fn {
				t.Fatalf("parseHandler(%q) = %q, %q; want %q, %q", tt.handler, file, fn, tt.file, tt.fn)
			}
		})
	}
}

func TestTaskCommand(t *testing.T) {
	a := New(Config{BashPath: "/bin/bash"})
	tests := []struct {
		name       string
		entrypoint string
		args       []string
		want       []string
		wantErr    bool
	}{
		{name: "entrypoint", entrypoint: "run.sh", args: []string{"a", "b c"}, want: []string{"/bin/bash", "./run.sh", "a", "b c"}},
		{name: "entrypoint in a directory", entrypoint: "bin/run.sh", want: []string{"/bin/bash", "bin/run.sh"}},
		{name: "args only", args: []string{"python3", "-c", "print(1)"}, want: []string{"python3", "-c", "print(1)"}},
		{name: "nothing", wantErr: true},
		{name: "absolute entrypoint", entrypoint: "/bin/sh", wantErr: true},
		{name: "escaping entrypoint", entrypoint: "../x.sh", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := a.TaskCommand(tt.entrypoint, tt.args, time.Minute)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("TaskCommand = %q, want an error", got)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("TaskCommand = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
	if New(Config{}).Name() != "bash" {
		t.Fatal("Name() is not bash")
	}
}

// handlers is the handler file most invocation tests load.
const handlers = `
counter=0
declare -A seen=()
echo "sourced" >&2

echo_fn() { printf '%s' "$1"; }
argc() { printf '%s' "$#"; }
env_fn() {
	printf '{"id":"%s","uid":"%s","greeting":"%s","pwd":"%s","home":"%s","leak":"%s","outputs_set":%s}' \
		"$STOKE_INVOCATION_ID" "$STOKE_RUN_UID" "$GREETING" "$PWD" "$HOME" "${STOKE_TEST_LEAK-}" \
		"$([[ -n $STOKE_OUTPUTS ]] && echo true || echo false)"
}
state() {
	counter=$((counter + 1))
	seen[$1]=1
	export MUTATED=1
	local here=$PWD
	cd /
	echo_fn() { printf 'redefined'; }
	printf '{"counter":%d,"seen":%d,"mutated":"%s","cwd":"%s"}' "$counter" "${#seen[@]}" "${OLD_MUTATED-}" "$here"
	OLD_MUTATED=x
}
fail() { echo "something broke" >&2; return 3; }
exit_fn() { exit 4; }
killed() { kill -KILL $BASHPID; }
outputs_ok() { printf 'answer=42\nname=stoke\n' >"$STOKE_OUTPUTS"; echo '"ok"'; }
outputs_bad() { printf 'not a key value line\n' >"$STOKE_OUTPUTS"; echo '"ok"'; }
outputs_fifo() { mkfifo "$STOKE_OUTPUTS"; echo '"ok"'; }
outputs_link() { ln -s /etc/hostname "$STOKE_OUTPUTS"; echo '"ok"'; }
outputs_big() { for i in $(seq 1 100); do echo "k$i=v"; done >"$STOKE_OUTPUTS"; echo '"ok"'; }
silent() { :; }
fds() { printf '"%s"' "$(ls /proc/self/fd | sort -n | tr '\n' ' ')"; }
redirect() { exec 2>/dev/null 4>/dev/null 5>/dev/null 6>/dev/null; printf '"ok"'; }
closed() { exec >&-; }
set_e() { set -e; false; echo '"not reached"'; }
exact() { printf '"'; head -c $(( $1 - 2 )) /dev/zero | tr '\0' a; printf '"'; }
`

func TestInvoke(t *testing.T) {
	t.Setenv("STOKE_TEST_LEAK", "server environment")
	f := newFixture(t, map[string]string{"h.sh": handlers})

	tests := []invokeCase{
		{fn: "echo_fn", input: `{"a":[1,2,"x y"]}`, want: `{"a":[1,2,"x y"]}`},
		{fn: "echo_fn", input: `"multi\nline \"quoted\" $(id) ` + "`id`" + `"`, want: `"multi\nline \"quoted\" $(id) ` + "`id`" + `"`},
		{fn: "argc", input: `"a b c"`, want: "1"},
		// External commands inherit stdin, stdout and stderr only (ls has
		// its own directory open as the fourth), besides what this test
		// process itself was given to pass on.
		{fn: "fds", input: `{}`, want: `"` + inheritableFds(0, 1, 2, 3) + `"`},
		// Whatever the function does to its fds, the invocation ends.
		{fn: "redirect", input: `{}`, want: `"ok"`},
		{fn: "closed", input: `{}`, want: ""},
		{fn: "set_e", input: `{}`, errType: "Runtime.ExitError", errMsg: "handler exited with status 1"},
		{fn: "env_fn", input: `null`, wantJSON: map[string]any{
			"id": "inv-1", "uid": "uid-1", "greeting": "hello", "pwd": f.dir, "home": f.dir, "leak": "", "outputs_set": true}},
		{fn: "silent", input: `{}`, want: ""},
		{fn: "fail", input: `{}`, errType: "Runtime.ExitError", errMsg: "handler exited with status 3", errTrace: "something broke"},
		{fn: "exit_fn", input: `{}`, errType: "Runtime.ExitError", errMsg: "handler exited with status 4"},
		{fn: "killed", input: `{}`, errType: "Runtime.ExitError", errMsg: "handler exited with status 137"},
		{fn: "outputs_ok", input: `{}`, want: "\"ok\"\n", outputs: map[string]string{"answer": "42", "name": "stoke"}},
		{fn: "outputs_bad", input: `{}`, errType: "Runtime.InvalidOutputs", errMsg: "KEY=VALUE"},
		{fn: "outputs_big", input: `{}`, errType: "Runtime.InvalidOutputs", errMsg: "100 keys"},
		{fn: "outputs_fifo", input: `{}`, errType: "Runtime.InvalidOutputs", errMsg: "not a regular file"},
		{fn: "outputs_link", input: `{}`, errType: "Runtime.InvalidOutputs", errMsg: "symbolic link"},
		{fn: "exact", input: strconv.Itoa(bounds.InvokeBody), want: `"` + strings.Repeat("a", bounds.InvokeBody-2) + `"`},
		{fn: "exact", input: strconv.Itoa(bounds.InvokeBody + 1), errType: "Runtime.OutputTooLarge"},
	}
	for _, tt := range tests {
		name := tt.fn + "/" + tt.input
		if len(name) > 40 {
			name = name[:40]
		}
		t.Run(name, func(t *testing.T) {
			in := f.mustLoad("h." + tt.fn)
			// Twice: the instance stays usable after every kind of result.
			for range 2 {
				checkInvoke(t, in, f, tt)
			}
		})
	}
}

// invokeCase is one expected invocation result.
type invokeCase struct {
	fn       string
	input    string
	want     string            // exact output, unless wantJSON
	wantJSON map[string]any    // decoded output
	outputs  map[string]string // want Result.Outputs
	errType  string            // want a FunctionError of this type
	errMsg   string            // … whose message contains this
	errTrace string            // … and whose stack trace contains this
}

func checkInvoke(t *testing.T, in *instance, f *fixture, tt invokeCase) {
	t.Helper()
	res, err := invokeID(in, "inv-1", tt.input, invokeTimeout)
	if tt.errType != "" {
		var fe *errdefs.FunctionError
		if !errors.As(err, &fe) || fe.Type != tt.errType || !strings.Contains(fe.Message, tt.errMsg) ||
			!strings.Contains(fe.StackTrace, tt.errTrace) {
			t.Fatalf("Invoke = %.100q, %#v; want a %s error with %q and trace %q", res.Output, err, tt.errType, tt.errMsg, tt.errTrace)
		}
		return
	}
	if err != nil {
		t.Fatalf("Invoke: %v", err)
	}
	if tt.wantJSON != nil {
		var got map[string]any
		if err := json.Unmarshal(res.Output, &got); err != nil || !reflect.DeepEqual(got, tt.wantJSON) {
			t.Fatalf("output %s (%v), want %v", res.Output, err, tt.wantJSON)
		}
	} else if string(res.Output) != tt.want {
		t.Fatalf("output %.200q, want %.200q", res.Output, tt.want)
	}
	if !reflect.DeepEqual(res.Outputs, tt.outputs) {
		t.Fatalf("outputs %v, want %v", res.Outputs, tt.outputs)
	}
}

// invokeID invokes with a given invocation ID.
func invokeID(in *instance, id, input string, timeout time.Duration) (runtime.Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return in.Invoke(ctx, runtime.Invocation{ID: id, RunUID: "uid-1", Input: []byte(input)})
}

func TestStateIsolation(t *testing.T) {
	f := newFixture(t, map[string]string{"h.sh": handlers})
	in := f.mustLoad("h.state")
	for i := range 5 {
		res, err := f.invoke(in, strconv.Quote("k"+strconv.Itoa(i)), invokeTimeout)
		if err != nil {
			t.Fatal(err)
		}
		want := `{"counter":1,"seen":1,"mutated":"","cwd":"` + f.dir + `"}`
		if string(res.Output) != want {
			t.Fatalf("call %d: %s, want %s: state leaked from an earlier call", i, res.Output, want)
		}
	}
	// A function redefined by an invocation is back to its original in the
	// next one, and a fresh instance of another function is unaffected.
	echo := f.mustLoad("h.echo_fn")
	if res, err := f.invoke(echo, `"x"`, invokeTimeout); err != nil || string(res.Output) != `"x"` {
		t.Fatalf("echo after state: %q, %v", res.Output, err)
	}
}

func TestHandlerFileOptions(t *testing.T) {
	// A file that turns on errexit, nounset, xtrace and pipefail, and
	// shadows builtins, must neither break nor trace the warm shell, and
	// its options must hold inside the handler.
	f := newFixture(t, map[string]string{"strict.sh": `
set -euxo pipefail
shopt -s expand_aliases nullglob
alias printf=false
IFS=0123456789
read() { return 1; }
wait() { return 1; }
kill() { return 1; }
trap 'echo EXIT-TRAP >&2' EXIT
opts() { builtin printf '%s|%s' "$-" "$(shopt -o pipefail | tr -s ' \t' ' ')"; }
unset_var() { echo "$undefined_variable"; }
errexit() { false; echo '"not reached"'; }
`})
	in := f.mustLoad("strict.opts")
	for range 3 {
		res, err := f.invoke(in, `{}`, invokeTimeout)
		if err != nil {
			t.Fatal(err)
		}
		flags, pipefail, _ := strings.Cut(string(res.Output), "|")
		if !strings.Contains(flags, "e") || !strings.Contains(flags, "u") || strings.Contains(flags, "m") ||
			!strings.Contains(pipefail, "on") {
			t.Fatalf("options in the handler: %q, want e and u, no m, pipefail on", res.Output)
		}
	}
	for _, fn := range []string{"unset_var", "errexit"} {
		in := f.mustLoad("strict." + fn)
		_, err := f.invoke(in, `{}`, invokeTimeout)
		var fe *errdefs.FunctionError
		if !errors.As(err, &fe) || fe.Type != "Runtime.ExitError" {
			t.Fatalf("%s: %v, want an exit error from the file's own options", fn, err)
		}
	}
}

func TestLoadErrors(t *testing.T) {
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "evil.sh"), []byte("handle() { echo pwned; }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		files   map[string]string
		setup   func(t *testing.T, wd string)
		handler string
		want    []string
	}{
		{name: "missing file", handler: "nope.handle", want: []string{"nope.sh", "does not exist"}},
		{name: "syntax error", files: map[string]string{"h.sh": "handle() {\n  echo hi\n"},
			handler: "h.handle", want: []string{"sourcing h.sh failed with status 2", "syntax error"}},
		{name: "failing last command", files: map[string]string{"h.sh": "handle() { :; }\necho about to fail >&2\nfalse\n"},
			handler: "h.handle", want: []string{"sourcing h.sh failed with status 1", "about to fail"}},
		{name: "missing function", files: map[string]string{"h.sh": "other() { :; }\n"},
			handler: "h.handle", want: []string{`h.sh does not define a function "handle"`}},
		{name: "variable is not a function", files: map[string]string{"h.sh": "handle=1\n"},
			handler: "h.handle", want: []string{`does not define a function "handle"`}},
		{name: "exit while sourcing", files: map[string]string{"h.sh": "echo bye >&2\nexit 7\n"},
			handler: "h.handle", want: []string{"bash exited with status 7 while sourcing h.sh", "bye"}},
		{name: "command not found", files: map[string]string{"h.sh": "no_such_command_xyz\n"},
			handler: "h.handle", want: []string{"status 127", "no_such_command_xyz"}},
		{name: "symlink outside", handler: "link.handle", want: []string{"outside the working directory"},
			setup: func(t *testing.T, wd string) {
				if err := os.Symlink(filepath.Join(outside, "evil.sh"), filepath.Join(wd, "link.sh")); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "directory symlink outside", handler: "lib/evil.handle", want: []string{"outside the working directory"},
			setup: func(t *testing.T, wd string) {
				if err := os.Symlink(outside, filepath.Join(wd, "lib")); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "directory", handler: "dir.handle", want: []string{"not a regular file"},
			setup: func(t *testing.T, wd string) {
				if err := os.Mkdir(filepath.Join(wd, "dir.sh"), 0o700); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "bad handler", handler: "h.no-such", want: []string{"function name"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, tt.files)
			if tt.setup != nil {
				tt.setup(t, f.dir)
			}
			_, err := f.load(tt.handler)
			if err == nil {
				t.Fatal("Load succeeded")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("Load error %q does not contain %q", err, w)
				}
			}
			if len(err.Error()) > bounds.Message {
				t.Fatalf("Load error is %d bytes", len(err.Error()))
			}
			if entries, _ := os.ReadDir(f.spec.ScratchDir); len(entries) != 0 {
				t.Fatalf("scratch directory not cleaned up: %v", entries)
			}
		})
	}
}

func TestLoadCancelled(t *testing.T) {
	f := newFixture(t, map[string]string{"slow.sh": "echo $$ >shell.pid\necho loading >&2\nsleep 1000\nhandle() { :; }\n"})
	spec := f.spec
	spec.Handler = "slow.handle"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	loading := f.rec.waitFor("loading")
	go func() {
		<-loading
		cancel()
	}()
	start := time.Now()
	_, err := New(Config{}).Load(ctx, spec)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Load = %v, want the context's error", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("Load returned after %v", d)
	}
	assertGone(t, readPid(t, filepath.Join(f.dir, "shell.pid")))
}

func TestStdoutFlood(t *testing.T) {
	f := newFixture(t, map[string]string{"h.sh": handlers + `flood() { [[ $1 == '"flood"' ]] && yes; echo_fn "$1"; }` + "\n"})
	in := f.mustLoad("h.flood")
	for range 2 {
		start := time.Now()
		_, err := f.invoke(in, `"flood"`, invokeTimeout)
		var fe *errdefs.FunctionError
		if !errors.As(err, &fe) || fe.Type != "Runtime.OutputTooLarge" {
			t.Fatalf("flood: %v, want Runtime.OutputTooLarge", err)
		}
		if d := time.Since(start); d > invokeTimeout/2 {
			t.Fatalf("flood took %v", d)
		}
		res, err := f.invoke(in, `"next"`, invokeTimeout)
		if err != nil || string(res.Output) != `"next"` {
			t.Fatalf("after the flood: %q, %v", res.Output, err)
		}
	}
}

// TestBackgroundJob checks that a background job that outlives the
// function and holds its stdout neither holds up the answer nor survives
// the invocation.
func TestBackgroundJob(t *testing.T) {
	f := newFixture(t, map[string]string{"h.sh": `bg() { sleep 1000 & echo "$!" >bg.pid; printf '"ok"'; }` + "\n"})
	in := f.mustLoad("h.bg")
	for range 2 {
		start := time.Now()
		res, err := f.invoke(in, `{}`, invokeTimeout)
		if err != nil || string(res.Output) != `"ok"` {
			t.Fatalf("Invoke = %q, %v", res.Output, err)
		}
		if d := time.Since(start); d >= in.grace {
			t.Fatalf("invocation took %v: it waited for the background job", d)
		}
		assertGone(t, readPid(t, filepath.Join(f.dir, "bg.pid")))
	}
}

// A child exits right after its trailer, so the warm shell may report its
// exit before Go has read the trailer (likelier after a large output): the
// result still carries the function's own status, not the child's (0).
func TestStatusComesFromTheTrailer(t *testing.T) {
	f := newFixture(t, map[string]string{"h.sh": `big() { head -c 300000 /dev/zero | tr '\0' a; return "$1"; }` + "\n"})
	in := f.mustLoad("h.big")
	for i := range 40 {
		status := []string{"0", "3"}[i%2]
		res, err := f.invoke(in, status, invokeTimeout)
		if status == "0" {
			if err != nil || len(res.Output) != 300000 {
				t.Fatalf("call %d: %d bytes, %v", i, len(res.Output), err)
			}
			continue
		}
		var fe *errdefs.FunctionError
		if !errors.As(err, &fe) || fe.Message != "handler exited with status 3" {
			t.Fatalf("call %d: %v, want the handler's status 3", i, err)
		}
	}
}

func TestStderrFlood(t *testing.T) {
	const size = 10 << 20
	f := newFixture(t, map[string]string{"h.sh": `noisy() { head -c ` + strconv.Itoa(size) + ` /dev/zero | tr '\0' x >&2; echo '"done"'; }` + "\n"})
	in := f.mustLoad("h.noisy")
	res, err := invokeID(in, "noisy-1", `{}`, invokeTimeout)
	if err != nil || string(res.Output) != "\"done\"\n" {
		t.Fatalf("Invoke = %q, %v", res.Output, err)
	}
	_ = in.Close() // drains stderr
	total := 0
	for _, lr := range f.rec.stderrLines() {
		line := lr.attrs["line"]
		if strings.Trim(line, "x") != "" {
			continue
		}
		if len(line) > bounds.LogLine {
			t.Fatalf("a log line of %d bytes", len(line))
		}
		if lr.attrs["invocation_id"] != "noisy-1" {
			t.Fatalf("stderr line logged with %v", lr.attrs)
		}
		total += len(line)
	}
	if total != size {
		t.Fatalf("logged %d bytes of stderr, want %d", total, size)
	}
}

func TestStderrAttribution(t *testing.T) {
	f := newFixture(t, map[string]string{"h.sh": "echo loading >&2\nlog() { echo \"line of $STOKE_INVOCATION_ID\" >&2; printf 'partial' >&2; }\n"})
	in := f.mustLoad("h.log")
	for _, id := range []string{"first", "second"} {
		if _, err := invokeID(in, id, `{}`, invokeTimeout); err != nil {
			t.Fatal(err)
		}
	}
	_ = in.Close()
	got := map[string]bool{}
	for _, lr := range f.rec.stderrLines() {
		got[lr.attrs["line"]+"@"+lr.attrs["invocation_id"]] = lr.attrs["stream"] == "stderr"
	}
	for _, want := range []string{"loading@", "line of first@first", "partial@first", "line of second@second", "partial@second"} {
		if !got[want] {
			t.Fatalf("no stderr line %q; got %v", want, got)
		}
	}
	if len(got) != 5 {
		t.Fatalf("stderr lines %v, want exactly 5 (no markers, no blank lines)", got)
	}
}

// timeoutHandlers record the child's and a background job's PIDs before
// blocking, unless the payload says otherwise.
const timeoutHandlers = `
block() {
	if [[ $1 == '"quick"' ]]; then echo '"quick"'; return; fi
	sleep 1000 &
	echo "$!" >bg.pid
	echo "$BASHPID" >child.pid
	echo started >&2
	wait
}
`

func TestTimeoutKillsGroup(t *testing.T) {
	f := newFixture(t, map[string]string{"h.sh": timeoutHandlers})
	in := f.mustLoad("h.block")
	for range 2 {
		started := f.rec.waitFor("started")
		start := time.Now()
		_, err := f.invoke(in, `{}`, 2*time.Second)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Invoke = %v, want DeadlineExceeded", err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("timed-out invocation returned after %v", d)
		}
		select {
		case <-started: // the PID files are written
		default:
			t.Fatal("the handler had not started when its invocation timed out")
		}
		assertGone(t, readPid(t, filepath.Join(f.dir, "child.pid")))
		assertGone(t, readPid(t, filepath.Join(f.dir, "bg.pid")))
		res, err := f.invoke(in, `"quick"`, invokeTimeout)
		if err != nil || string(res.Output) != "\"quick\"\n" {
			t.Fatalf("after the timeout: %q, %v", res.Output, err)
		}
	}
}

func TestCancel(t *testing.T) {
	f := newFixture(t, map[string]string{"h.sh": timeoutHandlers})
	in := f.mustLoad("h.block")
	started := f.rec.waitFor("started")
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := in.Invoke(ctx, runtime.Invocation{ID: "c", Input: []byte(`{}`)})
		errc <- err
	}()
	select {
	case <-started:
	case <-time.After(invokeTimeout):
		t.Fatal("handler did not start")
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Invoke = %v, want Canceled", err)
	}
	assertGone(t, readPid(t, filepath.Join(f.dir, "bg.pid")))
	if res, err := f.invoke(in, `"quick"`, invokeTimeout); err != nil || string(res.Output) != "\"quick\"\n" {
		t.Fatalf("after cancel: %q, %v", res.Output, err)
	}
}

// TestCancelStress cancels invocations at every point of their life and
// checks that no request is lost or answered twice: every later call gets
// its own answer.
func TestCancelStress(t *testing.T) {
	f := newFixture(t, map[string]string{"h.sh": handlers})
	in := f.mustLoad("h.echo_fn")
	for i := range 60 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%20)*100*time.Microsecond)
		_, _ = in.Invoke(ctx, runtime.Invocation{ID: "x", Input: []byte(`"cancelled"`)})
		cancel()
		want := strconv.Quote("call " + strconv.Itoa(i))
		res, err := f.invoke(in, want, invokeTimeout)
		if err != nil || string(res.Output) != want {
			t.Fatalf("call %d after a cancelled one: %q, %v; want %s", i, res.Output, err, want)
		}
	}
}

func TestRuntimeKilled(t *testing.T) {
	f := newFixture(t, map[string]string{"h.sh": timeoutHandlers})
	t.Run("idle", func(t *testing.T) {
		in := f.mustLoad("h.block")
		if _, err := f.invoke(in, `"quick"`, invokeTimeout); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(in.proc.Pid(), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		select {
		case <-in.Done():
		case <-time.After(invokeTimeout):
			t.Fatal("Done not closed after the warm shell was killed")
		}
		if _, err := f.invoke(in, `"quick"`, invokeTimeout); err == nil {
			t.Fatal("Invoke on a dead instance succeeded")
		}
		in.mu.Lock()
		idle := in.cur
		in.mu.Unlock()
		_ = in.Close()
		if idle != nil {
			assertGone(t, idle.pid)
		}
	})
	t.Run("during an invocation", func(t *testing.T) {
		in := f.mustLoad("h.block")
		started := f.rec.waitFor("started")
		errc := make(chan error, 1)
		go func() {
			_, err := f.invoke(in, `{}`, invokeTimeout)
			errc <- err
		}()
		<-started
		if err := syscall.Kill(in.proc.Pid(), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		err := <-errc
		var fe *errdefs.FunctionError
		if !errors.As(err, &fe) || fe.Type != "Runtime.ExitError" {
			t.Fatalf("Invoke = %v, want Runtime.ExitError", err)
		}
		<-in.Done()
		assertGone(t, readPid(t, filepath.Join(f.dir, "child.pid")))
		assertGone(t, readPid(t, filepath.Join(f.dir, "bg.pid")))
	})
}

func TestClose(t *testing.T) {
	f := newFixture(t, map[string]string{"h.sh": handlers})
	in := f.mustLoad("h.echo_fn")
	if _, err := f.invoke(in, `1`, invokeTimeout); err != nil {
		t.Fatal(err)
	}
	shell := in.proc.Pid()
	for range 2 {
		if err := in.Close(); err != nil {
			t.Fatal(err)
		}
	}
	assertGone(t, shell)
	select {
	case <-in.Done():
	default:
		t.Fatal("Done open after Close")
	}
	if _, err := f.invoke(in, `1`, invokeTimeout); err == nil {
		t.Fatal("Invoke after Close succeeded")
	}
	if entries, _ := os.ReadDir(f.spec.ScratchDir); len(entries) != 0 {
		t.Fatalf("scratch directory not cleaned up: %v", entries)
	}
}

func TestEnvIsExact(t *testing.T) {
	f := newFixture(t, map[string]string{"h.sh": `dump() { env -0 | sort -z | tr '\0' '\n'; }` + "\n"})
	in := f.mustLoad("h.dump")
	res, err := invokeID(in, "env-1", `{}`, invokeTimeout)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, kv := range strings.Split(strings.TrimSpace(string(res.Output)), "\n") {
		k, _, _ := strings.Cut(kv, "=")
		got[k] = true
	}
	want := map[string]bool{"STOKE_INVOCATION_ID": true, "STOKE_OUTPUTS": true, "STOKE_RUN_UID": true, "STOKE_SCOPE": true,
		// bash's own
		"PWD": true, "SHLVL": true, "OLDPWD": true, "_": true}
	for _, kv := range f.spec.Env {
		k, _, _ := strings.Cut(kv, "=")
		want[k] = true
	}
	for k := range got {
		if !want[k] {
			t.Errorf("unexpected variable %s in the handler's environment", k)
		}
	}
	for _, k := range []string{"STOKE_INVOCATION_ID", "STOKE_OUTPUTS", "STOKE_RUN_UID", "GREETING", "PATH"} {
		if !got[k] {
			t.Errorf("variable %s missing from the handler's environment", k)
		}
	}
}

// inheritableFds lists, as ls would, the given fds and those this process
// got from its parent without close-on-exec, which every child inherits.
func inheritableFds(fds ...int) string {
	entries, _ := os.ReadDir("/proc/self/fd")
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 3 {
			continue
		}
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC == 0 {
			fds = append(fds, fd)
		}
	}
	slices.Sort(fds)
	var b strings.Builder
	for _, fd := range fds {
		b.WriteString(strconv.Itoa(fd) + " ")
	}
	return b.String()
}

// readPid reads a PID a handler wrote.
func readPid(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// assertGone waits, on a pidfd rather than by polling, for pid to exit
// (zombies count as exited: nobody may reap them here).
func assertGone(t *testing.T, pid int) {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return
	}
	if err != nil {
		t.Fatalf("pidfd_open(%d): %v", pid, err)
	}
	defer unix.Close(fd)
	for {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(invokeTimeout/time.Millisecond))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n != 1 {
			t.Fatalf("process %d still running (%v)", pid, err)
		}
		return
	}
}

// A child left idle rehearses the request path before it blocks for a
// request; one forked while a request waits does not. Either way the
// handler starts from the state right after registration: the same
// variables (plus the request's: __stoke_seq, MAPFILE and the two
// STOKE_ variables of the call), the same functions, MAPFILE holding the
// request alone.
func TestIdleChildStartsFromRegistrationState(t *testing.T) {
	f := newFixture(t, map[string]string{"v.sh": `
vars() {
	builtin printf '"%s|%s|%s"' "$(compgen -v | grep -vE '^(BASH_.*|_|FUNCNAME|PIPESTATUS|LINENO|SECONDS|RANDOM|SRANDOM|EPOCH.*|BASHPID|PPID)$' | tr '\n' ' ')" \
		"${#MAPFILE[@]}:${MAPFILE[1]}" "$(declare -F | tr '\n' ' ')"
}
`})
	in := f.mustLoad("v.vars")
	var first string
	for i := range 4 {
		if i%2 == 0 {
			awaitIdleChild(t, in)
		}
		call := "call-" + strconv.Itoa(i)
		res, err := f.invoke(in, `"`+call+`"`, invokeTimeout)
		if err != nil {
			t.Fatal(err)
		}
		got := strings.ReplaceAll(string(res.Output), call, "call-N")
		if i == 0 {
			first = got
			if !strings.Contains(got, `|3:"call-N"|`) {
				t.Fatalf("call 0: %s, want MAPFILE to hold the ID, the payload and the scope alone", got)
			}
			vars, _, _ := strings.Cut(got, "|")
			if n := strings.Count(vars, "__stoke_"); n != 1 || !strings.Contains(vars, " __stoke_seq ") {
				t.Fatalf("call 0: variables %s, want __stoke_seq alone of the bootstrap's", vars)
			}
			continue
		}
		if got != first {
			t.Fatalf("call %d (idle child: %v) started from\n%s\nbut call 0 from\n%s", i, i%2 == 0, got, first)
		}
	}
}

// awaitIdleChild waits until the warm shell's newest child is blocked
// reading its control pipe (fd 4): past anything it does before a request.
func awaitIdleChild(t *testing.T, in *instance) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		in.mu.Lock()
		c := in.cur
		in.mu.Unlock()
		if c != nil {
			// /proc/PID/syscall: the number of the syscall it is blocked
			// in (0 is read) and its first argument, the fd.
			if b, err := os.ReadFile("/proc/" + strconv.Itoa(c.pid) + "/syscall"); err == nil &&
				strings.HasPrefix(string(b), "0 0x4 ") {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the warm shell's child did not block on its control pipe within 10 s")
		}
		time.Sleep(time.Millisecond) // /proc has no event to await
	}
}

// After an answer the next request's files are made (and the answered
// one's removed) once the next child is announced, not only when the next
// request comes; a request that comes before makes them itself (every other
// test calls back to back).
func TestNextRequestFilesAreMadeWhileIdle(t *testing.T) {
	f := newFixture(t, map[string]string{"e.sh": echoHandler})
	in := f.mustLoad("e.echo_fn")
	for i := 1; i <= 3; i++ {
		want := `"call-` + strconv.Itoa(i) + `"`
		res, err := f.invoke(in, want, invokeTimeout)
		if err != nil || string(res.Output) != want {
			t.Fatalf("call %d = %q, %v", i, res.Output, err)
		}
		awaitIdleChild(t, in)
		answered := filepath.Join(in.scratch, "req."+strconv.Itoa(i))
		next := filepath.Join(in.scratch, "req."+strconv.Itoa(i+1))
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, errAnswered := os.Stat(answered)
			_, errNext := os.Stat(next)
			if errors.Is(errAnswered, os.ErrNotExist) && errNext == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after call %d: %s: %v, %s: %v; want the first removed and the second made", i, answered, errAnswered, next, errNext)
			}
			time.Sleep(time.Millisecond) // the file system has no event to await
		}
	}
}
