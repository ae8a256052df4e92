package bootstrap_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"stoke.dev/stoke/internal/lambda/lambdasim"
	"stoke.dev/stoke/internal/lambda/payload"
	"stoke.dev/stoke/internal/testbin"
	"stoke.dev/stoke/internal/testdeps"
)

var stokeBin, rieBin, goEchoBin string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		var cleanup func()
		var err error
		if stokeBin, cleanup, err = testbin.Stoke(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer cleanup()
		for _, d := range []struct {
			path *string
			name string
		}{{&rieBin, "aws-lambda-rie"}, {&goEchoBin, "lambdaecho"}} {
			if *d.path, err = testdeps.Path(d.name); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		return m.Run()
	}())
}

// sandbox runs bin as the bootstrap of a package holding files, under the
// RIE alone.
func sandbox(tb testing.TB, bin string, files map[string]string, env ...string) *lambdasim.Sandbox {
	tb.Helper()
	dir := tb.TempDir()
	task := filepath.Join(dir, "task")
	if err := os.Mkdir(task, 0o755); err != nil {
		tb.Fatal(err)
	}
	// Run under the name bootstrap, as Lambda runs it.
	if err := os.Symlink(bin, filepath.Join(task, "bootstrap")); err != nil {
		tb.Fatal(err)
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(task, name), []byte(text), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	sb, err := lambdasim.StartSandbox(context.Background(), rieBin, dir, task, append(env, "TMPDIR="+tb.TempDir()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(sb.Close)
	return sb
}

func event(t testing.TB, req payload.Request) []byte {
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

const bashHandler = `count=0
handle() {
	count=$((count + 1))
	case "$1" in
	'"fail"') echo "it broke" >&2; return 4 ;;
	esac
	printf 'greeting=hi\n' >> "$STOKE_OUTPUTS"
	printf '{"echo":%s,"count":%d,"user":"%s"}' "$1" "$count" "$USER_VAR"
}
`

func TestBashFunctionUnderTheRIE(t *testing.T) {
	sb := sandbox(t, stokeBin, map[string]string{"h.sh": bashHandler},
		"STOKE_RUNTIME=bash", "_HANDLER=h.handle", "USER_VAR=mine", "STOKE_ENV_KEYS=USER_VAR")
	ctx := context.Background()
	// Each invocation starts from the state right after registration, as on a pod.
	for range 2 {
		out, err := sb.Invoke(ctx, event(t, payload.Request{Kind: payload.KindInvoke, Input: json.RawMessage(`{"a":1}`)}))
		if err != nil {
			t.Fatal(err)
		}
		var resp payload.Response
		if err := json.Unmarshal(out, &resp); err != nil || string(resp.Output) != `{"echo":{"a":1},"count":1,"user":"mine"}` || resp.Outputs["greeting"] != "hi" {
			t.Fatalf("invoke = %s (%v)", out, err)
		}
	}
	out, err := sb.Invoke(ctx, event(t, payload.Request{Kind: payload.KindInvoke, Input: json.RawMessage(`"fail"`)}))
	var perr payload.Error
	if err == nil || json.Unmarshal(out, &perr) != nil || perr.Type != "Runtime.ExitError" || !strings.Contains(strings.Join(perr.StackTrace, "\n"), "it broke") {
		t.Fatalf("failing invocation = %s, %v; want Runtime.ExitError with the handler's stderr", out, err)
	}
	out, err = sb.Invoke(ctx, event(t, payload.Request{Kind: payload.KindTask, Task: &payload.Task{Entrypoint: "h.sh"}}))
	var resp payload.Response
	if err != nil || json.Unmarshal(out, &resp) != nil || resp.Task == nil || resp.Task.State != "EXECUTION_STATE_SUCCEEDED" {
		t.Fatalf("task on a function = %s, %v", out, err)
	}
}

func TestInvocationTimeoutAndVerbatimOutputUnderTheRIE(t *testing.T) {
	sb := sandbox(t, stokeBin, map[string]string{"h.py": "import time\n\ndef handle(event):\n    if isinstance(event, int):\n        time.sleep(event)\n    return event\n"},
		"STOKE_RUNTIME=python", "_HANDLER=h.handle")
	ctx := context.Background()
	// The invocation's own timeout ends the handler's call inside the
	// sandbox, long before the function's (ten minutes here).
	out, err := sb.Invoke(ctx, payload.InvokeEvent("inv-t", 300, json.RawMessage(`600`)))
	var perr payload.Error
	if err == nil || json.Unmarshal(out, &perr) != nil || perr.Type != payload.ErrorTimeout {
		t.Fatalf("invocation past its timeout = %s, %v; want %s", out, err, payload.ErrorTimeout)
	}
	// The sandbox serves the next one, and the output comes back as the
	// handler wrote it, not HTML-escaped.
	in := `"<a & b>"`
	out, err = sb.Invoke(ctx, payload.InvokeEvent("inv-v", 10000, json.RawMessage(in)))
	var resp payload.Response
	if err != nil || json.Unmarshal(out, &resp) != nil || string(resp.Output) != in {
		t.Fatalf("invoke = %s, %v; want the output %s verbatim", out, err, in)
	}
}

func TestTaskFunctionUnderTheRIE(t *testing.T) {
	sb := sandbox(t, stokeBin, map[string]string{"t.sh": "echo out \"$1\"\necho err >&2\necho K=V >> \"$STOKE_OUTPUTS\"\nexit \"$2\"\n"},
		"STOKE_RUNTIME=bash", "_HANDLER="+payload.TaskHandler)
	for _, code := range []int32{0, 5} {
		out, err := sb.Invoke(context.Background(), event(t, payload.Request{Kind: payload.KindTask,
			Task: &payload.Task{Entrypoint: "t.sh", Args: []string{"x", fmt.Sprint(code)}}}))
		var resp payload.Response
		if err != nil || json.Unmarshal(out, &resp) != nil || resp.Task == nil {
			t.Fatalf("task = %s, %v", out, err)
		}
		if resp.Task.ExitCode != code || resp.Task.Stdout != "out x\n" || resp.Task.Stderr != "err\n" || (code == 0 && resp.Outputs["K"] != "V") {
			t.Fatalf("task exiting %d: result %+v outputs %v", code, resp.Task, resp.Outputs)
		}
	}
}

// TestTaskTimeoutUnderTheRIE: a task event carries Stoke's timeout; at it
// the bootstrap kills the task's process group and answers the contract's
// TIMED_OUT, long before the function's timeout (ten minutes here).
func TestTaskTimeoutUnderTheRIE(t *testing.T) {
	mark := fmt.Sprintf("TASK_MARK=%d", time.Now().UnixNano())
	sb := sandbox(t, stokeBin, map[string]string{"t.sh": "sleep 60 &\nwait\n"},
		"STOKE_RUNTIME=bash", "_HANDLER="+payload.TaskHandler, mark, "STOKE_ENV_KEYS=TASK_MARK")
	out, err := sb.Invoke(context.Background(), event(t, payload.Request{Kind: payload.KindTask, TimeoutMillis: 1000,
		Task: &payload.Task{Entrypoint: "t.sh"}}))
	var resp payload.Response
	if err != nil || json.Unmarshal(out, &resp) != nil || resp.Task == nil || resp.Task.State != "EXECUTION_STATE_TIMED_OUT" {
		t.Fatalf("task past its timeout = %s, %v; want EXECUTION_STATE_TIMED_OUT", out, err)
	}
	// The group was killed before the answer; the sleep may take a moment
	// to be reaped, and no event tells: /proc is polled.
	deadline := time.Now().Add(10 * time.Second)
	for len(lambdasim.Processes("sleep", mark)) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the task's sleep still runs in the sandbox after its timeout")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// BenchmarkBootstrapEcho compares Stoke's bootstrap running a Python and a
// Bash echo handler with a minimal aws-lambda-go echo function, all under
// the same RIE, interleaved in one run so that load hits them alike.
func BenchmarkBootstrapEcho(b *testing.B) {
	cases := []struct {
		name string
		sb   *lambdasim.Sandbox
	}{
		{"go", sandbox(b, goEchoBin, nil)},
		{"python", sandbox(b, stokeBin, map[string]string{"h.py": "def handle(event):\n    return event\n"}, "STOKE_RUNTIME=python", "_HANDLER=h.handle")},
		{"bash", sandbox(b, stokeBin, map[string]string{"h.sh": "handle() { printf '%s' \"$1\"; }\n"}, "STOKE_RUNTIME=bash", "_HANDLER=h.handle")},
	}
	ev := event(b, payload.Request{Kind: payload.KindInvoke, Input: json.RawMessage(`{"hello":"world"}`)})
	ctx := context.Background()
	lat := make([][]time.Duration, len(cases))
	for i, c := range cases {
		if _, err := c.sb.Invoke(ctx, ev); err != nil { // init
			b.Fatalf("%s: %v", c.name, err)
		}
		lat[i] = make([]time.Duration, 0, b.N)
	}
	b.ResetTimer()
	for range b.N {
		for i, c := range cases {
			start := time.Now()
			if _, err := c.sb.Invoke(ctx, ev); err != nil {
				b.Fatalf("%s: %v", c.name, err)
			}
			lat[i] = append(lat[i], time.Since(start))
		}
	}
	b.StopTimer()
	p50 := make([]float64, len(cases))
	for i, c := range cases {
		slices.Sort(lat[i])
		p50[i] = float64(lat[i][len(lat[i])/2].Microseconds())
		b.ReportMetric(p50[i], c.name+"-p50-µs")
	}
	b.ReportMetric(p50[1]/p50[0], "python/go")
	b.ReportMetric(p50[2]/p50[0], "bash/go")
}
