package runtime_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	rt "stoke.dev/stoke/internal/runtime"
)

// bashTasks is the one local piece: an argv builder. Everything it starts
// is a real process. An entrypoint runs as a bash script; without one the
// args are the argv.
type bashTasks struct{}

func (bashTasks) Name() string                 { return "bash-test" }
func (bashTasks) ValidateHandler(string) error { return nil }
func (bashTasks) Load(context.Context, rt.FunctionSpec) (rt.Instance, error) {
	return nil, errors.New("bash-test: no function mode")
}
func (bashTasks) TaskCommand(entrypoint string, args []string, _ time.Duration) ([]string, error) {
	if entrypoint == "" {
		if len(args) == 0 {
			return nil, errors.New("nothing to run: no entrypoint and no args")
		}
		return args, nil
	}
	return append([]string{"bash", entrypoint}, args...), nil
}

type fixture struct {
	tasks   *rt.Tasks
	work    string // workspace root, also the working directory
	scratch string
}

// newFixture returns a Tasks table over a fresh workspace. Cleanup closes
// it, then checks that no scratch directory and no goroutine is left.
func newFixture(t testing.TB, configure func(*rt.TasksConfig)) *fixture {
	t.Helper()
	// Per fixture rather than in TestMain, so that the package's other test
	// files stay free to have their own; goroutines that existed before the
	// fixture (a benchmark's runner) are not its leaks.
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) }) // registered first, runs last
	ws, err := rt.NewWorkspace(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{work: ws.Root(), scratch: filepath.Join(t.TempDir(), "scratch")}
	cfg := rt.TasksConfig{
		Adapter:     bashTasks{},
		Workspace:   ws,
		ScratchRoot: f.scratch,
		Logger:      slog.New(slog.DiscardHandler),
		KillGrace:   5 * time.Second,
	}
	if configure != nil {
		configure(&cfg)
	}
	f.tasks, err = rt.NewTasks(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		left, err := os.ReadDir(f.scratch)
		if err != nil {
			t.Errorf("reading the scratch root: %v", err)
		}
		if len(left) > 0 {
			t.Errorf("scratch directories left after Close: %v", left)
		}
	})
	t.Cleanup(func() { f.tasks.Close(0) })
	return f
}

func (f *fixture) write(t testing.TB, name, body string, mode os.FileMode) {
	t.Helper()
	p := filepath.Join(f.work, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), mode); err != nil {
		t.Fatal(err)
	}
}

// execute starts a request, filling in the working directory.
func (f *fixture) execute(t testing.TB, req *pb.ExecuteRequest) {
	t.Helper()
	if req.WorkingDir == "" {
		req.WorkingDir = f.work
	}
	resp, err := f.tasks.Execute(context.Background(), req)
	if err != nil {
		t.Fatalf("Execute(%s): %v", req.Id, err)
	}
	if resp.GetId() != req.Id {
		t.Fatalf("Execute returned id %q, want %q", resp.GetId(), req.Id)
	}
}

// wait waits for a terminal state; 30 s is only a guard against a hang.
func (f *fixture) wait(t testing.TB, id string) *pb.StatusResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := f.tasks.Wait(ctx, &pb.StatusRequest{Id: id})
	if err != nil {
		t.Fatalf("Wait(%s): %v", id, err)
	}
	if !terminal(st.State) {
		t.Fatalf("execution %s is still %s after 30s", id, st.State)
	}
	return st
}

func (f *fixture) run(t testing.TB, req *pb.ExecuteRequest) *pb.StatusResponse {
	t.Helper()
	f.execute(t, req)
	return f.wait(t, req.Id)
}

func (f *fixture) status(t testing.TB, id string) *pb.StatusResponse {
	t.Helper()
	st, err := f.tasks.Status(context.Background(), &pb.StatusRequest{Id: id})
	if err != nil {
		t.Fatalf("Status(%s): %v", id, err)
	}
	return st
}

// fifo makes a FIFO in the workspace to which a script writes one line once
// it is ready, and returns a function reading that line. It is opened
// read-write, which never blocks and keeps a writer, so the read waits for
// the line and fails at a deadline instead of hanging.
func (f *fixture) fifo(t testing.TB, name string) func() string {
	t.Helper()
	p := filepath.Join(f.work, name)
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return func() string {
		t.Helper()
		if err := r.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(r).ReadString('\n')
		if err != nil {
			t.Fatalf("reading %s: %v", name, err)
		}
		return strings.TrimSpace(line)
	}
}

func readPID(t testing.TB, s string) int {
	t.Helper()
	pid, err := strconv.Atoi(s)
	if err != nil || pid <= 1 {
		t.Fatalf("bad pid %q", s)
	}
	return pid
}

// assertGone checks that pid has exited: already reaped, or exiting within
// 10 s, which a `sleep 1000` only does when killed. A pidfd sees a zombie
// as exited, so an init that does not reap orphans does not matter.
func assertGone(t testing.TB, pid int) {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return
	}
	if err != nil {
		t.Fatalf("pidfd_open(%d): %v", pid, err)
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 10_000)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			t.Fatalf("poll pidfd %d: %v", pid, err)
		}
		if n == 0 {
			t.Errorf("process %d is still running: the process group was not killed", pid)
		}
		return
	}
}

func terminal(s pb.ExecutionState) bool {
	switch s {
	case pb.ExecutionState_EXECUTION_STATE_SUCCEEDED, pb.ExecutionState_EXECUTION_STATE_FAILED,
		pb.ExecutionState_EXECUTION_STATE_TIMED_OUT, pb.ExecutionState_EXECUTION_STATE_CANCELLED:
		return true
	}
	return false
}

const (
	succeeded = pb.ExecutionState_EXECUTION_STATE_SUCCEEDED
	failed    = pb.ExecutionState_EXECUTION_STATE_FAILED
	timedOut  = pb.ExecutionState_EXECUTION_STATE_TIMED_OUT
	cancelled = pb.ExecutionState_EXECUTION_STATE_CANCELLED
	running   = pb.ExecutionState_EXECUTION_STATE_RUNNING
)

func TestExecuteOutcomes(t *testing.T) {
	// Set in this process's env: a task must never see it.
	t.Setenv("STOKE_TEST_SECRET", "leaked")

	tests := []struct {
		name    string
		script  string // run as the entrypoint task.sh when set
		args    []string
		env     map[string]string
		files   map[string]string // extra executable files in the workspace
		state   pb.ExecutionState
		exit    int32
		stdout  string
		stderr  string
		errMsg  string // substring of error_message; "" means it is empty
		outputs map[string]string
		check   func(t *testing.T, f *fixture, st *pb.StatusResponse)
	}{
		{
			name:   "exit 0 with stdout and stderr",
			script: "echo hello; echo note >&2",
			state:  succeeded, stdout: "hello\n", stderr: "note\n",
		},
		{
			name:   "args are passed as separate words",
			script: `printf '<%s>\n' "$@"`,
			args:   []string{"a b", "", "$HOME", "c"},
			state:  succeeded, stdout: "<a b>\n<>\n<$HOME>\n<c>\n",
		},
		{
			name:   "non-zero exit carries the end of stderr",
			script: "echo working; echo 'boom: disk full' >&2; exit 3",
			state:  failed, exit: 3, stdout: "working\n", stderr: "boom: disk full\n",
			errMsg: "exited with status 3: boom: disk full",
		},
		{
			name:   "non-zero exit without stderr",
			script: "exit 2",
			state:  failed, exit: 2, errMsg: "exited with status 2",
		},
		{
			name:   "stdin is /dev/null",
			script: "cat; echo eof",
			state:  succeeded, stdout: "eof\n",
		},
		{
			name:  "executable not found is a failed execution",
			args:  []string{"stoke-no-such-command"},
			state: failed, exit: -1, errMsg: `executable "stoke-no-such-command" not found in PATH`,
		},
		{
			name:  "bare command names are found in the child's PATH",
			args:  []string{"hello-tool", "x"},
			env:   map[string]string{"PATH": "/tools-not-here:BIN:/usr/bin:/bin"},
			files: map[string]string{"bin/hello-tool": "#!/bin/sh\necho tool \"$1\"\n"},
			state: succeeded, stdout: "tool x\n",
		},
		{
			name:    "valid outputs",
			script:  `printf 'RESULT=42\nURL=http://x/?a=b\n\nRESULT=43\n' > "$STOKE_OUTPUTS"`,
			state:   succeeded,
			outputs: map[string]string{"RESULT": "43", "URL": "http://x/?a=b"},
		},
		{
			name:   "invalid outputs fail the execution",
			script: `echo 'not a pair' > "$STOKE_OUTPUTS"`,
			state:  failed, errMsg: "invalid outputs: outputs line 1: want KEY=VALUE",
		},
		{
			name:   "oversized outputs fail the execution",
			script: `for i in $(seq 1 9); do printf 'K%d=%08000d\n' "$i" 0; done > "$STOKE_OUTPUTS"`,
			state:  failed, errMsg: "invalid outputs: outputs: more than 65536 bytes in all",
		},
		{
			name:   "an outputs value over its bound fails the execution",
			script: `printf 'K=%09000d\n' 0 > "$STOKE_OUTPUTS"`,
			state:  failed, errMsg: `value of "K" is 9000 bytes`,
		},
		{
			name:   "a FIFO as outputs fails instead of blocking",
			script: `mkfifo "$STOKE_OUTPUTS"`,
			state:  failed, errMsg: "not a regular file",
		},
		{
			name:   "outputs of a failed execution are ignored",
			script: `echo K=v > "$STOKE_OUTPUTS"; exit 1`,
			state:  failed, exit: 1, errMsg: "exited with status 1",
		},
		{
			name:    "STOKE_OUTPUTS cannot be redirected by the request",
			script:  `echo K=v > "$STOKE_OUTPUTS"`,
			env:     map[string]string{"STOKE_OUTPUTS": "WORK/mine"},
			state:   succeeded,
			outputs: map[string]string{"K": "v"},
			check: func(t *testing.T, f *fixture, _ *pb.StatusResponse) {
				if _, err := os.Stat(filepath.Join(f.work, "mine")); !os.IsNotExist(err) {
					t.Errorf("the task wrote the request's STOKE_OUTPUTS: %v", err)
				}
			},
		},
		{
			name:   "$GITHUB_PATH's directories come first on the exported PATH, the last added first",
			script: "echo \"$PATH\"; echo /opt/a >> \"$GITHUB_PATH\"; printf '/opt/b\\r\\n\\n' >> \"$GITHUB_PATH\"",
			state:  succeeded,
			check: func(t *testing.T, _ *fixture, st *pb.StatusResponse) {
				if want := "/opt/b:/opt/a:" + strings.TrimSpace(st.Stdout); st.Env["PATH"] != want || strings.TrimSpace(st.Stdout) == "" {
					t.Errorf("exported PATH = %q, want %q", st.Env["PATH"], want)
				}
			},
		},
		{
			name:   "a $GITHUB_PATH directory holding ':' fails the execution",
			script: `echo /a:/b >> "$GITHUB_PATH"`,
			state:  failed, errMsg: `invalid outputs: $GITHUB_PATH line 1: "/a:/b" cannot be on PATH`,
		},
		{
			name:   "env isolation: only the base and the request's env",
			script: `echo "${STOKE_TEST_SECRET-unset} $GREETING"; env | cut -d= -f1 | sort | tr '\n' ' '`,
			env:    map[string]string{"GREETING": "hi"},
			state:  succeeded,
			check: func(t *testing.T, _ *fixture, st *pb.StatusResponse) {
				// bash itself adds PWD, SHLVL and _.
				want := "unset hi\nGITHUB_ENV GITHUB_OUTPUT GITHUB_PATH GITHUB_STATE GITHUB_STEP_SUMMARY GREETING HOME LANG PATH PWD SHLVL STOKE_OUTPUTS TMPDIR _ "
				if st.Stdout != want {
					t.Errorf("stdout = %q, want %q", st.Stdout, want)
				}
			},
		},
		{
			name:   "HOME is the working directory, TMPDIR private scratch",
			script: `echo "$HOME"; echo "$TMPDIR"; pwd; touch "$TMPDIR/x"`,
			state:  succeeded,
			check: func(t *testing.T, f *fixture, st *pb.StatusResponse) {
				lines := strings.Split(strings.TrimSpace(st.Stdout), "\n")
				if len(lines) != 3 || lines[0] != f.work || lines[2] != f.work ||
					!strings.HasPrefix(lines[1], f.scratch+string(filepath.Separator)) {
					t.Errorf("HOME, TMPDIR, pwd = %q; want %s, a directory under %s, %s", lines, f.work, f.scratch, f.work)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, nil)
			req := &pb.ExecuteRequest{Id: "run-1", Args: tc.args, Env: map[string]string{}}
			for k, v := range tc.env {
				v = strings.ReplaceAll(v, "BIN", filepath.Join(f.work, "bin"))
				req.Env[k] = strings.ReplaceAll(v, "WORK", f.work)
			}
			for name, body := range tc.files {
				f.write(t, name, body, 0o755)
			}
			if tc.script != "" {
				f.write(t, "task.sh", tc.script, 0o644)
				req.Entrypoint = "task.sh"
			}
			st := f.run(t, req)
			if st.Id != req.Id || st.State != tc.state || st.ExitCode != tc.exit {
				t.Errorf("id, state, exit = %s, %s, %d; want %s, %s, %d (error_message %q)",
					st.Id, st.State, st.ExitCode, req.Id, tc.state, tc.exit, st.ErrorMessage)
			}
			if tc.check == nil && st.Stdout != tc.stdout {
				t.Errorf("stdout = %q, want %q", st.Stdout, tc.stdout)
			}
			if st.Stderr != tc.stderr {
				t.Errorf("stderr = %q, want %q", st.Stderr, tc.stderr)
			}
			if (tc.errMsg == "") != (st.ErrorMessage == "") || !strings.Contains(st.ErrorMessage, tc.errMsg) {
				t.Errorf("error_message = %q, want it to contain %q", st.ErrorMessage, tc.errMsg)
			}
			if !maps.Equal(st.Outputs, tc.outputs) {
				t.Errorf("outputs = %v, want %v", st.Outputs, tc.outputs)
			}
			if tc.check != nil {
				tc.check(t, f, st)
			}
		})
	}
}

func TestExecuteValidation(t *testing.T) {
	f := newFixture(t, nil)
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(f.work, "escape")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		modify func(r *pb.ExecuteRequest)
		field  string // the error message starts with it
		want   string // and contains this
	}{
		{"empty id", func(r *pb.ExecuteRequest) { r.Id = "" }, "id", "must not be empty"},
		{"id too long", func(r *pb.ExecuteRequest) { r.Id = strings.Repeat("x", bounds.RunUID+1) }, "id", "at most 128"},
		{"handler set", func(r *pb.ExecuteRequest) { r.Handler = "main.handler" }, "handler", "no function emulation through Execute"},
		{"absolute entrypoint", func(r *pb.ExecuteRequest) { r.Entrypoint = "/bin/true" }, "entrypoint", "relative"},
		{"entrypoint escapes", func(r *pb.ExecuteRequest) { r.Entrypoint = "a/../../x.sh" }, "entrypoint", "'..'"},
		{"entrypoint too long", func(r *pb.ExecuteRequest) { r.Entrypoint = strings.Repeat("a", bounds.Arg+1) }, "entrypoint", "at most"},
		{"too many args", func(r *pb.ExecuteRequest) { r.Args = make([]string, bounds.Args+1) }, "args", "257 entries"},
		{"arg too long", func(r *pb.ExecuteRequest) { r.Args = []string{"true", strings.Repeat("a", bounds.Arg+1)} }, "args[1]", "at most 8192"},
		{"NUL in an arg", func(r *pb.ExecuteRequest) { r.Args = []string{"true", "a\x00b"} }, "args[1]", "NUL"},
		{"bad env key", func(r *pb.ExecuteRequest) { r.Env = map[string]string{"1BAD": "x"} }, "env", `"1BAD"`},
		{"NUL in an env value", func(r *pb.ExecuteRequest) { r.Env = map[string]string{"K": "a\x00"} }, "env", "NUL"},
		{"negative timeout", func(r *pb.ExecuteRequest) { r.TimeoutSeconds = -1 }, "timeout_seconds", "negative"},
		{"no working_dir", func(r *pb.ExecuteRequest) { r.WorkingDir = "" }, "working_dir", "must not be empty"},
		{"relative working_dir", func(r *pb.ExecuteRequest) { r.WorkingDir = "work" }, "working_dir", "not an absolute path"},
		{"working_dir outside the workspace", func(r *pb.ExecuteRequest) { r.WorkingDir = outside }, "working_dir", "outside the workspace"},
		{"working_dir escaping by symlink", func(r *pb.ExecuteRequest) { r.WorkingDir = filepath.Join(f.work, "escape") }, "working_dir", "outside the workspace"},
		{"missing working_dir", func(r *pb.ExecuteRequest) { r.WorkingDir = filepath.Join(f.work, "nope") }, "working_dir", "does not exist"},
		{"adapter refuses the command", func(r *pb.ExecuteRequest) { r.Args = nil }, "entrypoint", "nothing to run"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := &pb.ExecuteRequest{Id: "v-1", Args: []string{"true"}, WorkingDir: f.work}
			tc.modify(req)
			_, err := f.tasks.Execute(context.Background(), req)
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("Execute: %v, want an invalid argument", err)
			}
			if !strings.HasPrefix(err.Error(), tc.field+":") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q: want it to name %s and contain %q", err, tc.field, tc.want)
			}
		})
	}
	list, err := f.tasks.List(context.Background(), &pb.ListRequest{})
	if err != nil || len(list.Entries) != 0 {
		t.Errorf("List after rejected requests = %v, %v; want nothing remembered", list, err)
	}
}

func TestExecuteIsIdempotent(t *testing.T) {
	f := newFixture(t, nil)
	// Each process appends one line; the FIFO holds it until all the
	// concurrent Executes have returned.
	ready := f.fifo(t, "ready.fifo")
	f.write(t, "once.sh", "echo started >> runs.log; echo $$ > ready.fifo; read -r _ < go.fifo; echo finished", 0o644)
	goFIFO := filepath.Join(f.work, "go.fifo")
	if err := syscall.Mkfifo(goFIFO, 0o600); err != nil {
		t.Fatal(err)
	}
	// Read-write, so that writing never waits for the task to open it.
	release, err := os.OpenFile(goFIFO, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer release.Close()
	req := func(args ...string) *pb.ExecuteRequest {
		return &pb.ExecuteRequest{Id: "same", Entrypoint: "once.sh", Args: args, WorkingDir: f.work}
	}

	const callers = 16
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for i := range callers {
		wg.Go(func() {
			resp, err := f.tasks.Execute(context.Background(), req(strconv.Itoa(i)))
			if err == nil && resp.GetId() != "same" {
				err = fmt.Errorf("returned id %q", resp.GetId())
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("concurrent Execute: %v", err)
		}
	}
	readPID(t, ready())
	if st := f.status(t, "same"); st.State != running {
		t.Errorf("state while held = %s, want RUNNING", st.State)
	}
	f.execute(t, req("again while running"))
	if _, err := release.WriteString("go\n"); err != nil {
		t.Fatal(err)
	}
	st := f.wait(t, "same")
	f.execute(t, req("again when finished"))
	if after := f.status(t, "same"); after.State != succeeded || after.Stdout != st.Stdout {
		t.Errorf("after a repeat: %s %q, want the first execution's SUCCEEDED %q", after.State, after.Stdout, st.Stdout)
	}
	runs, err := os.ReadFile(filepath.Join(f.work, "runs.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(runs), "started"); n != 1 {
		t.Errorf("%d processes started for one id, want 1", n)
	}
}

func TestTimeoutKillsTheGroup(t *testing.T) {
	tests := []struct {
		name    string
		timeout int64
	}{
		{"0 means the maximum", 0},
		{"larger is clamped to the maximum", 3600},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, func(c *rt.TasksConfig) { c.MaxTaskDuration = 500 * time.Millisecond })
			ready := f.fifo(t, "ready.fifo")
			f.write(t, "hang.sh", "sleep 1000 & echo $! > ready.fifo; wait", 0o644)
			f.execute(t, &pb.ExecuteRequest{Id: "slow", Entrypoint: "hang.sh", TimeoutSeconds: tc.timeout})
			bg := readPID(t, ready())
			st := f.wait(t, "slow")
			if st.State != timedOut || !strings.Contains(st.ErrorMessage, "timed out after 500ms") {
				t.Errorf("state %s, error_message %q; want TIMED_OUT after 500ms", st.State, st.ErrorMessage)
			}
			assertGone(t, bg)
		})
	}
}

func TestBackgroundJobsDoNotOutliveTheExecution(t *testing.T) {
	f := newFixture(t, nil)
	ready := f.fifo(t, "ready.fifo")
	// The background sleep keeps stdout open: the execution must still end
	// when bash exits, and take the sleep with it.
	f.write(t, "bg.sh", "sleep 1000 & echo $! > ready.fifo; echo done", 0o644)
	f.execute(t, &pb.ExecuteRequest{Id: "bg", Entrypoint: "bg.sh"})
	bg := readPID(t, ready())
	st := f.wait(t, "bg")
	if st.State != succeeded || st.Stdout != "done\n" {
		t.Errorf("state %s, stdout %q; want SUCCEEDED, \"done\\n\"", st.State, st.Stdout)
	}
	assertGone(t, bg)
}

func TestCancel(t *testing.T) {
	f := newFixture(t, nil)
	ready := f.fifo(t, "ready.fifo")
	f.write(t, "hang.sh", "sleep 1000 & echo $! > ready.fifo; wait", 0o644)
	f.execute(t, &pb.ExecuteRequest{Id: "c", Entrypoint: "hang.sh"})
	bg := readPID(t, ready())

	ctx := context.Background()
	if _, err := f.tasks.Cancel(ctx, &pb.CancelRequest{Id: "c"}); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	if st := f.status(t, "c"); st.State != cancelled || st.ErrorMessage != "cancelled" {
		t.Errorf("after Cancel: %s %q, want CANCELLED", st.State, st.ErrorMessage)
	}
	assertGone(t, bg)
	if _, err := f.tasks.Cancel(ctx, &pb.CancelRequest{Id: "c"}); err != nil {
		t.Errorf("Cancel of a cancelled execution: %v, want OK", err)
	}
	if _, err := f.tasks.Cancel(ctx, &pb.CancelRequest{Id: "unknown"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Cancel of an unknown execution: %v, want not found", err)
	}
	st := f.run(t, &pb.ExecuteRequest{Id: "done", Args: []string{"true"}})
	if _, err := f.tasks.Cancel(ctx, &pb.CancelRequest{Id: "done"}); err != nil {
		t.Errorf("Cancel of a finished execution: %v, want OK", err)
	}
	if after := f.status(t, "done"); after.State != st.State {
		t.Errorf("Cancel changed a finished execution from %s to %s", st.State, after.State)
	}
}

func TestForget(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	f.execute(t, &pb.ExecuteRequest{Id: "f", Args: []string{"sleep", "1000"}})
	if _, err := f.tasks.Forget(ctx, &pb.ForgetRequest{Id: "f"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Forget while running: %v, want a failed precondition", err)
	}
	if _, err := f.tasks.Cancel(ctx, &pb.CancelRequest{Id: "f"}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second time it is unknown, which is OK too
		if _, err := f.tasks.Forget(ctx, &pb.ForgetRequest{Id: "f"}); err != nil {
			t.Errorf("Forget: %v", err)
		}
	}
	if _, err := f.tasks.Status(ctx, &pb.StatusRequest{Id: "f"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Status after Forget: %v, want not found", err)
	}
	// A forgotten id can be used again: it is a new execution.
	if st := f.run(t, &pb.ExecuteRequest{Id: "f", Args: []string{"echo", "again"}}); st.Stdout != "again\n" {
		t.Errorf("re-run after Forget: %s %q", st.State, st.Stdout)
	}
	// A finished execution has no scratch directory left, a file in its
	// TMPDIR and its outputs file included, before it is forgotten: the
	// scratch root holds only the pool of emptied directories, each
	// holding only its empty tmp.
	f.run(t, &pb.ExecuteRequest{Id: "g", Args: []string{"sh", "-c", `mkdir "$TMPDIR/d"; touch "$TMPDIR/d/x" "$STOKE_OUTPUTS"`}})
	if left, err := os.ReadDir(f.scratch); err != nil || len(left) != 1 || left[0].Name() != ".pool" {
		t.Errorf("scratch root after the executions finished: %v, %v; want only .pool", left, err)
	}
	pooled, err := filepath.Glob(filepath.Join(f.scratch, ".pool", "*", "*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pooled {
		if filepath.Base(p) != "tmp" {
			t.Errorf("a pooled scratch directory holds %s", p)
		} else if in, err := os.ReadDir(p); err != nil || len(in) > 0 {
			t.Errorf("a pooled tmp holds %v, %v", in, err)
		}
	}
	if _, err := f.tasks.Forget(ctx, &pb.ForgetRequest{Id: "g"}); err != nil {
		t.Errorf("Forget: %v", err)
	}
}

func TestCapturedOutput(t *testing.T) {
	const size = 3 << 20
	tests := []struct {
		name  string
		req   *pb.ExecuteRequest
		check func(t *testing.T, st *pb.StatusResponse)
	}{
		{
			name: "3 MiB on each stream keeps exactly the last MiB",
			req: &pb.ExecuteRequest{Args: []string{"bash", "-c", `
				head -c $0 /dev/zero | tr '\0' a; printf END
				head -c $0 /dev/zero | tr '\0' b >&2; printf END >&2`, strconv.Itoa(size)}},
			check: func(t *testing.T, st *pb.StatusResponse) {
				for _, s := range []struct{ name, got, fill string }{{"stdout", st.Stdout, "a"}, {"stderr", st.Stderr, "b"}} {
					want := strings.Repeat(s.fill, bounds.CapturedStream-3) + "END"
					if s.got != want {
						t.Errorf("%s: %d bytes ending %q, want the last %d bytes", s.name, len(s.got), s.got[max(0, len(s.got)-8):], bounds.CapturedStream)
					}
				}
			},
		},
		{
			name: "a character split by the cut is dropped",
			// 2 + 2n + 1 bytes: the cut falls inside an 'é'.
			req: &pb.ExecuteRequest{Args: []string{"python3", "-c",
				"import sys; sys.stdout.write('xx' + 'é' * (2 << 20) + 'y')"}},
			check: func(t *testing.T, st *pb.StatusResponse) {
				if len(st.Stdout) != bounds.CapturedStream-1 || !utf8.ValidString(st.Stdout) || !strings.HasSuffix(st.Stdout, "éy") {
					t.Errorf("stdout: %d bytes, valid UTF-8 %v; want %d bytes of whole characters", len(st.Stdout), utf8.ValidString(st.Stdout), bounds.CapturedStream-1)
				}
			},
		},
		{
			name: "bytes that are not UTF-8 are replaced",
			req:  &pb.ExecuteRequest{Args: []string{"printf", `\377\376ok\n`}},
			check: func(t *testing.T, st *pb.StatusResponse) {
				if st.Stdout != "\uFFFDok\n" {
					t.Errorf("stdout = %q", st.Stdout)
				}
			},
		},
		{
			name: "binary output still marshals",
			req:  &pb.ExecuteRequest{Args: []string{"head", "-c", "65536", "/dev/urandom"}},
			check: func(t *testing.T, st *pb.StatusResponse) {
				if _, err := proto.Marshal(st); err != nil {
					t.Errorf("marshal: %v", err)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, nil)
			tc.req.Id = "out"
			st := f.run(t, tc.req)
			if st.State != succeeded {
				t.Fatalf("state %s: %s", st.State, st.ErrorMessage)
			}
			tc.check(t, st)
		})
	}
}

func TestListAndRememberBound(t *testing.T) {
	f := newFixture(t, func(c *rt.TasksConfig) { c.MaxTerminal = 2 })
	for _, r := range []*pb.ExecuteRequest{
		{Id: "a", Args: []string{"true"}},
		{Id: "b", Args: []string{"false"}},
		{Id: "c", Args: []string{"sh", "-c", "echo out; exit 4"}},
	} {
		f.run(t, r)
	}
	f.execute(t, &pb.ExecuteRequest{Id: "d", Args: []string{"sleep", "1000"}})

	list, err := f.tasks.List(context.Background(), &pb.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	type entry struct {
		id    string
		state pb.ExecutionState
		exit  int32
	}
	var got []entry
	for _, e := range list.Entries {
		got = append(got, entry{e.Id, e.State, e.ExitCode})
		if e.Stdout != "" || e.Stderr != "" || e.ErrorMessage != "" || e.Outputs != nil {
			t.Errorf("List entry %s carries details: %v", e.Id, e)
		}
	}
	// "a", the oldest finished, is forgotten past the bound of 2; the
	// running "d" does not count.
	want := []entry{{"b", failed, 1}, {"c", failed, 4}, {"d", running, 0}}
	if !slices.Equal(got, want) {
		t.Errorf("List = %v, want %v", got, want)
	}
	if _, err := f.tasks.Status(context.Background(), &pb.StatusRequest{Id: "a"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Status of the evicted execution: %v, want not found", err)
	}
}

func TestWaitReturnsRunningAtItsDeadline(t *testing.T) {
	f := newFixture(t, nil)
	f.execute(t, &pb.ExecuteRequest{Id: "w", Args: []string{"sleep", "1000"}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := f.tasks.Wait(ctx, &pb.StatusRequest{Id: "w"})
	if err != nil || st.State != running {
		t.Fatalf("Wait = %v, %v; want RUNNING", st, err)
	}
	if ctx.Err() != nil {
		t.Errorf("Wait answered after its deadline; want a margin before it")
	}
	if _, err := f.tasks.Wait(context.Background(), &pb.StatusRequest{Id: "unknown"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Wait for an unknown execution: %v, want not found", err)
	}
}

func TestClose(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	if h, err := f.tasks.Health(ctx, &pb.HealthRequest{}); err != nil || !h.Healthy {
		t.Fatalf("Health before Close = %v, %v", h, err)
	}
	ready := f.fifo(t, "ready.fifo")
	f.write(t, "hang.sh", "sleep 1000 & echo $! > ready.fifo; wait", 0o644)
	f.execute(t, &pb.ExecuteRequest{Id: "r", Entrypoint: "hang.sh"})
	bg := readPID(t, ready())

	f.tasks.Close(time.Second)
	if st := f.status(t, "r"); st.State != cancelled || !strings.Contains(st.ErrorMessage, "shutting down") {
		t.Errorf("after Close: %s %q, want CANCELLED", st.State, st.ErrorMessage)
	}
	assertGone(t, bg)
	_, err := f.tasks.Execute(ctx, &pb.ExecuteRequest{Id: "late", Args: []string{"true"}, WorkingDir: f.work})
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Execute after Close: %v, want unavailable", err)
	}
	if h, err := f.tasks.Health(ctx, &pb.HealthRequest{}); err != nil || h.Healthy {
		t.Errorf("Health after Close = %v, %v; want unhealthy", h, err)
	}
}

// BenchmarkExecuteTrue measures one Execute + Wait (+ Forget) of `true`.
func BenchmarkExecuteTrue(b *testing.B) {
	f := newFixture(b, nil)
	ctx := context.Background()
	var lat []time.Duration
	for i := 0; b.Loop(); i++ {
		id := "bench-" + strconv.Itoa(i)
		start := time.Now()
		if _, err := f.tasks.Execute(ctx, &pb.ExecuteRequest{Id: id, Args: []string{"true"}, WorkingDir: f.work}); err != nil {
			b.Fatal(err)
		}
		st, err := f.tasks.Wait(ctx, &pb.StatusRequest{Id: id})
		lat = append(lat, time.Since(start))
		if err != nil || st.State != succeeded {
			b.Fatalf("%v %v", st, err)
		}
		if _, err := f.tasks.Forget(ctx, &pb.ForgetRequest{Id: id}); err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// A task whose command is "stoke" runs the server's own executable
// (TasksConfig.Self), whatever the task's PATH holds: how a workflow's
// hash Run runs `stoke hash-files` on a pod whose image has no stoke.
func TestSelfCommandRunsTheServersExecutable(t *testing.T) {
	self := filepath.Join(t.TempDir(), "the-server")
	if err := os.WriteFile(self, []byte("#!/bin/sh\nprintf '<%s>' \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, func(c *rt.TasksConfig) { c.Self = self })
	st := f.run(t, &pb.ExecuteRequest{Id: "self", Args: []string{rt.SelfCommand, "hash-files", "**/go.sum"}, Env: map[string]string{"PATH": "/usr/bin:/bin"}})
	if st.State != succeeded || string(st.Stdout) != "<hash-files><**/go.sum>" {
		t.Errorf("state %s, stdout %q, error %q", st.State, st.Stdout, st.ErrorMessage)
	}
	// Without Self, "stoke" is a command like any other.
	f = newFixture(t, nil)
	st = f.run(t, &pb.ExecuteRequest{Id: "path", Args: []string{rt.SelfCommand, "version"}, Env: map[string]string{"PATH": "/nonexistent"}})
	if st.State != failed || !strings.Contains(st.ErrorMessage, `"stoke" not found in PATH`) {
		t.Errorf("state %s, error %q", st.State, st.ErrorMessage)
	}
}

// $GITHUB_STEP_SUMMARY is kept (cut to its bound, also when the task
// fails, as GitHub keeps a failed step's); $GITHUB_STATE is read as
// GitHub reads it, a malformed one failing the task, and kept nowhere.
func TestStepSummaryAndState(t *testing.T) {
	f := newFixture(t, nil)
	for i, c := range []struct {
		script, summary, errMsg string
		state                   pb.ExecutionState
	}{
		{`echo '# Tests' >> "$GITHUB_STEP_SUMMARY"; echo 'key=v' >> "$GITHUB_STATE"`, "# Tests\n", "", succeeded},
		{`echo '| failed | 3 |' >> "$GITHUB_STEP_SUMMARY"; exit 4`, "| failed | 3 |\n", "exited with status 4", failed},
		{`echo nonsense >> "$GITHUB_STATE"`, "", "$GITHUB_STATE line 1", failed},
		{`head -c 9000 /dev/zero | tr '\0' x >> "$GITHUB_STEP_SUMMARY"`, "cut: the step summary is 9000 bytes", "", succeeded},
		{`ln -s /etc/hostname "$GITHUB_STEP_SUMMARY"`, "is a symbolic link", "", succeeded},
	} {
		f.write(t, "task.sh", c.script, 0o755)
		st := f.run(t, &pb.ExecuteRequest{Id: fmt.Sprintf("summary-%d", i), Entrypoint: "task.sh"})
		if st.State != c.state || !strings.Contains(st.Summary, c.summary) || (c.errMsg == "") != (st.ErrorMessage == "") || !strings.Contains(st.ErrorMessage, c.errMsg) {
			t.Errorf("%s: state %s, summary %.80q, error %q", c.script, st.State, st.Summary, st.ErrorMessage)
		}
		if len(st.Summary) > bounds.StepSummary+256 {
			t.Errorf("%s: a summary of %d bytes", c.script, len(st.Summary))
		}
	}
}
