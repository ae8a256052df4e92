package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/testbin"
)

// cliServer is a backend the CLI tests drive with the stoke binary: a
// `stoke up` (Up), or a cluster with Stoke installed (kube), reached
// through its kubeconfig as a user's KUBECONFIG.
type cliServer struct {
	*testbin.Up
	kube *kubeEnv
	// kubeEnviron is the environment of a cluster's user.
	kubeEnviron []string
	// dataplane says whether invoke, exec and logs work: always on stoke
	// up; on a cluster once the gateway is installed from deploy/.
	dataplane bool
}

// startCLIServer runs `stoke up` (startUp) on a new data directory. At the
// end of the test it gets SIGTERM and must exit 0.
func startCLIServer(t *testing.T) *cliServer {
	t.Helper()
	u := startUp(t, t.TempDir())
	t.Cleanup(func() {
		if err := u.Stop(); err != nil {
			t.Error(err)
		}
	})
	return &cliServer{Up: u.Up, dataplane: true}
}

// kubeCLIServer is the cluster of e as a user of the CLI has it: KUBECONFIG
// names its admin kubeconfig, and no stoke up runs on the machine (an
// empty state directory), so that the CLI chooses the cluster by itself.
// Invoke, exec and logs go through the API server to the gateway's
// aggregated API, with nothing but the kubeconfig.
func kubeCLIServer(t *testing.T, e *kubeEnv) *cliServer {
	_, err := os.Stat(repoPath("deploy/controller/gateway.yaml"))
	return &cliServer{kube: e, dataplane: err == nil,
		kubeEnviron: []string{"KUBECONFIG=" + e.cluster.Kubeconfig, "XDG_STATE_HOME=" + t.TempDir()}}
}

// env is the environment a user of this server has: STOKE_SERVER and
// STOKE_TOKEN, and nothing else of Stoke's; or KUBECONFIG for a cluster.
func (s *cliServer) env() []string {
	if s.kube != nil {
		return s.kubeEnviron
	}
	return []string{"STOKE_SERVER=" + s.URL, "STOKE_TOKEN=" + s.Token}
}

// standalone says whether s is a stoke up.
func (s *cliServer) standalone() bool { return s.kube == nil }

// cliResult is what one stoke command did.
type cliResult struct {
	stdout, stderr string
	code           int
}

func (r cliResult) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%sstderr:\n%s", r.code, r.stdout, r.stderr)
}

// cliCommand prepares `stoke args...` run from the repository root (so
// that examples/ paths are as in the README) with the process's
// environment minus STOKE_*, XDG_STATE_HOME and KUBECONFIG, plus env.
func cliCommand(ctx context.Context, env []string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, stokeBin, args...)
	cmd.Dir = ".."
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "STOKE_") && !strings.HasPrefix(kv, "XDG_STATE_HOME=") && !strings.HasPrefix(kv, "KUBECONFIG=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

// stoke runs one command to its end (at most two minutes) with stdin.
func stoke(t *testing.T, env []string, stdin string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := cliCommand(ctx, env, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(stdin), &stdout, &stderr
	err := cmd.Run()
	res := cliResult{stdout: stdout.String(), stderr: stderr.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		res.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("stoke %q: %v", args, err)
	}
	return res
}

// ok runs a command that must exit 0 and returns its stdout.
func (s *cliServer) ok(t *testing.T, args ...string) string {
	t.Helper()
	r := stoke(t, s.env(), "", args...)
	if r.code != 0 {
		t.Fatalf("stoke %s: %s", strings.Join(args, " "), r)
	}
	return r.stdout
}

// fails runs a command that must exit with code and print one error line
// containing want on stderr.
func (s *cliServer) fails(t *testing.T, code int, want string, args ...string) cliResult {
	t.Helper()
	r := stoke(t, s.env(), "", args...)
	if r.code != code || !strings.Contains(r.stderr, want) {
		t.Fatalf("stoke %s: want exit %d and %q on stderr, got %s", strings.Join(args, " "), code, want, r)
	}
	return r
}

// lastLine is the last line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

// getRun reads a Run with `stoke get run NAME -o json`.
func (s *cliServer) getRun(t *testing.T, name string) *v1alpha1.Run {
	t.Helper()
	var run v1alpha1.Run
	if err := json.Unmarshal([]byte(s.ok(t, "get", "run", name, "-o", "json")), &run); err != nil {
		t.Fatal(err)
	}
	return &run
}

// startStoke starts a long-running stoke command and delivers its stdout
// lines; the caller ends it.
func startStoke(t *testing.T, env []string, args ...string) (*exec.Cmd, <-chan string, *bytes.Buffer) {
	t.Helper()
	cmd := cliCommand(context.Background(), env, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1024)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd, lines, &stderr
}

// awaitLine reads lines until one satisfies match.
func awaitLine(t *testing.T, lines <-chan string, what string, match func(string) bool) {
	t.Helper()
	deadline := time.After(90 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("waiting for %s: the output ended", what)
			}
			if match(l) {
				return
			}
		case <-deadline:
			t.Fatalf("waiting for %s: not within 90s", what)
		}
	}
}

// exitCode waits for cmd and returns its exit status.
func exitCode(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(60 * time.Second):
		t.Fatalf("%q did not exit", cmd.Args)
		return -1
	}
}

// The stoke CLI, as a user drives it, against a real `stoke up`: the
// cases of cliCases, in order.
func TestCLI(t *testing.T) {
	runCLICases(t, startCLIServer(t))
}

// runCLICases runs cliCases against s, in order (later cases use what
// earlier ones made), each as a subtest; a case marked standaloneOnly
// runs on a stoke up only.
func runCLICases(t *testing.T, s *cliServer) {
	for _, c := range cliCases {
		if c.standaloneOnly && !s.standalone() {
			continue
		}
		t.Run(c.name, func(t *testing.T) { c.test(t, s) })
	}
}

// cliCase is one case of the CLI's end-to-end table, run against both
// backends: a `stoke up` (TestCLI) and a cluster through a kubeconfig
// (TestKube/CLI), so that the CLI behaves the same on both. Steps that
// reach a Run itself (invoke, exec, logs, and run of a task, which
// follows its log) need the cluster's gateway: they run where
// s.dataplane holds.
type cliCase struct {
	name           string
	standaloneOnly bool
	test           func(t *testing.T, s *cliServer)
}

var cliCases = []cliCase{
	{name: "task streams its output and exits with its code", test: cliTaskOutput},
	{name: "flags become the Run's spec", test: cliFlagsToSpec},
	{name: "the token comes from flags, env or the data directory", standaloneOnly: true, test: cliTokenSources},
	{name: "version", test: cliVersion},
	{name: "bash function", test: cliBashFunction},
	{name: "invoke picks a Function by name", test: cliInvokeFunction},
	{name: "python function and its errors", test: cliPythonFunction},
	{name: "invoke exits 124 when the invocation times out", test: cliInvokeTimeout},
	{name: "apply", test: cliApply},
	{name: "a Function: run --scale, get, describe, apply, delete", test: cliFunction},
	{name: "get and describe", test: cliGetDescribe},
	{name: "get -w prints changes until Ctrl-C", test: cliGetWatch},
	{name: "Ctrl-C cancels the task", test: cliInterrupt},
	{name: "exec as kubectl exec", test: cliExec},
	{name: "run -i and -t as docker run", test: cliRunInteractive},
	{name: "cancel and delete", test: cliCancelDelete},
	{name: "delete takes names, -l and -f as kubectl does", test: cliDeleteMany},
	{name: "errors are one line", test: cliErrors},
	{name: "help and completion", test: cliHelpCompletion},
	{name: "probes take one socket flag", standaloneOnly: true, test: cliProbeFlags},
}

func cliTaskOutput(t *testing.T, s *cliServer) {
	if !s.dataplane {
		t.Log("no gateway on this cluster: run follows a task's log through it")
		return
	}
	r := stoke(t, s.env(), "", "run", "--runtime", "bash", "--source", "examples/task/task.sh", "-e", "GREETING=hi", "--", "world")
	if r.code != 0 || r.stdout != "hi, world\n" || !strings.Contains(r.stderr, "task: greeted world\n") || !strings.Contains(r.stderr, "stoke: output GREETED=world\n") {
		t.Errorf("task from a file: %s", r)
	}
	r = stoke(t, s.env(), "", "run", "--runtime", "bash", "--source", "examples/task/task.sh", "-e", "EXIT_CODE=3", "--", "three")
	if r.code != 3 || r.stdout != "hello, three\n" || !strings.HasPrefix(r.stderr, "task: greeted three\n") {
		t.Errorf("task exiting 3: %s", r)
	}
	for l := range strings.Lines(r.stderr) {
		// Like docker run: a task's own exit code comes without a
		// message of Stoke's (outputs aside).
		if strings.HasPrefix(l, "stoke: ") && !strings.HasPrefix(l, "stoke: output ") {
			t.Errorf("task exiting 3 printed %q", l)
		}
	}
	r = stoke(t, s.env(), "", "run", "--runtime", "bash", "--source", "examples/task", "--entrypoint", "task.sh", "-q", "--", "dir")
	if r.code != 0 || r.stdout != "hello, dir\n" || r.stderr != "task: greeted dir\n" {
		t.Errorf("task from a directory, quiet: %s", r)
	}
	// No "--" needed: flags end at the first argument.
	r = stoke(t, s.env(), "", "run", "--runtime", "bash", "bash", "-c", "echo out; echo err >&2; exit 7")
	if r.code != 7 || r.stdout != "out\n" || r.stderr != "err\n" {
		t.Errorf("argv task exiting 7: %s", r)
	}
	r = stoke(t, s.env(), "", "run", "--runtime", "python", "--", "-c", "import sys; print('py'); sys.exit(5)")
	if r.code != 5 || r.stdout != "py\n" {
		t.Errorf("python task exiting 5: %s", r)
	}
	r = s.fails(t, 124, "Timeout", "run", "--runtime", "bash", "--timeout", "1s", "--", "sleep", "60")
	if !strings.HasPrefix(lastLine(r.stderr), "stoke: run/task-") {
		t.Errorf("timeout message: %q", r.stderr)
	}
}

func cliFlagsToSpec(t *testing.T, s *cliServer) {
	name := strings.TrimSpace(s.ok(t, "run", "--runtime", "bash", "--name", "specced", "--detach", "--retries", "2", "--timeout", "45s",
		"--ttl", "1h", "-l", "team=cli", "-e", "A=1", "--", "true"))
	if name != "specced" {
		t.Fatalf("--detach printed %q", name)
	}
	run := s.getRun(t, "specced")
	sp := run.Spec
	if sp.RetryPolicy == nil || sp.RetryPolicy.MaxAttempts != 3 || sp.Timeout == nil || sp.Timeout.Duration != 45*time.Second ||
		sp.TTLSecondsAfterFinished == nil || *sp.TTLSecondsAfterFinished != 3600 || run.Labels["team"] != "cli" ||
		len(sp.Env) != 1 || sp.Env[0] != (v1alpha1.EnvVar{Name: "A", Value: "1"}) || sp.Mode.Task == nil || sp.Mode.Task.Args[0] != "true" {
		t.Errorf("spec = %+v, labels %v", sp, run.Labels)
	}
	if out := s.ok(t, "get", "runs", "-l", "team=cli", "-o", "name"); out != "run/specced\n" {
		t.Errorf("get -l team=cli -o name = %q", out)
	}
	if s.dataplane {
		s.ok(t, "run", "--runtime", "bash", "--name", "removed", "--rm", "-q", "--", "true")
		s.fails(t, 1, "not found", "get", "run", "removed")
	}
}

func cliTokenSources(t *testing.T, s *cliServer) {
	for _, tc := range []struct {
		env  []string
		args []string
	}{
		{[]string{"STOKE_SERVER=" + s.URL, "STOKE_DATA_DIR=" + s.DataDir}, nil},
		{nil, []string{"--server", s.URL, "--token", s.Token}},
		{[]string{"STOKE_SERVER=" + s.URL}, []string{"--data-dir", s.DataDir}},
		// STOKE_SERVER is Stoke's own setting: it wins over KUBECONFIG.
		{[]string{"STOKE_SERVER=" + s.URL, "STOKE_TOKEN=" + s.Token, "KUBECONFIG=/nonexistent"}, nil},
	} {
		r := stoke(t, tc.env, "", append([]string{"get", "runtimes"}, tc.args...)...)
		if r.code != 0 || !strings.Contains(r.stdout, "python") {
			t.Errorf("env %q args %q: %s", tc.env, tc.args, r)
		}
	}
	// Flags of both backends at once are refused, not guessed between.
	s.fails(t, 1, "--server name a standalone server and --context a cluster", "get", "runs", "--server", s.URL, "--context", "x")
}

func cliVersion(t *testing.T, s *cliServer) {
	out := s.ok(t, "version")
	v, backend, _ := strings.Cut(out, "\n")
	v += "\n"
	if !strings.HasPrefix(v, "stoke ") || !strings.Contains(v, ", commit ") || !strings.HasSuffix(v, "built with "+runtime.Version()+"\n") {
		t.Errorf("stoke version: %q", v)
	}
	if flag := s.ok(t, "--version"); flag != v {
		t.Errorf("stoke --version %q, stoke version %q", flag, v)
	}
	// The second line says which backend the client commands use, and why.
	var want string
	if s.standalone() {
		want = "backend: standalone " + s.URL + ", chosen by STOKE_SERVER, namespace default\n"
	} else {
		want = fmt.Sprintf("backend: cluster (context %q, API server %s, gateway %s%s), chosen by KUBECONFIG (and no local stoke up token), namespace default\n",
			"kubetest", s.kube.cluster.Config.Host, s.kube.cluster.Config.Host, "/apis/gateway.stoke.dev/v1alpha1")
	}
	if backend != want {
		t.Errorf("stoke version's backend line %q, want %q", backend, want)
	}
}

// stoke invoke NAME goes to the Function NAME through its stable URL
// when there is one (here a replica Run labelled with its name), else to
// the function Run NAME; a name that is neither says so.
func cliInvokeFunction(t *testing.T, s *cliServer) {
	if !s.dataplane {
		t.Log("no gateway on this cluster: no invocations")
		return
	}
	if r := stoke(t, s.env(), "", "run", "--runtime", "bash", "--source", "examples/bash-echo", "--handler", "handler.handle",
		"--name", "greet-0", "-l", "stoke.dev/function=greet"); r.code != 0 {
		t.Fatalf("run greet-0: %s", r)
	}
	if out := s.ok(t, "invoke", "greet", "-d", `{"by":"name"}`); !strings.Contains(out, `"echo":{"by":"name"}`) {
		t.Errorf("invoke of the Function greet: %q", out)
	}
	// The replica is also a function Run of its own name.
	if out := s.ok(t, "invoke", "greet-0", "-d", `{"by":"run"}`); !strings.Contains(out, `"echo":{"by":"run"}`) {
		t.Errorf("invoke of the Run greet-0: %q", out)
	}
	s.fails(t, 1, `"nothing-here" not found: neither a Function nor a Run has that name`, "invoke", "nothing-here")
	s.ok(t, "delete", "greet-0", "--wait")
}

func cliBashFunction(t *testing.T, s *cliServer) {
	ran := stoke(t, s.env(), "", "run", "--runtime", "bash", "--source", "examples/bash-echo", "--handler", "handler.handle", "--name", "echo")
	endpoint := strings.TrimSpace(ran.stdout)
	if ran.code != 0 || !strings.Contains(endpoint, "/namespaces/default/runs/echo/") {
		t.Fatalf("run: %s", ran)
	}
	if !strings.Contains(ran.stderr, "\n  stoke invoke echo\n") {
		t.Errorf("hint: %s", ran.stderr)
	}
	if !s.standalone() {
		if !s.dataplane {
			t.Log("no gateway on this cluster: no invocations")
			return
		}
	} else {
		// The hint assumes no input of its own (the function's is unknown):
		// its commands work as printed.
		if !strings.HasPrefix(endpoint, s.URL+"/v1/namespaces/default/runs/echo/") || !strings.Contains(ran.stderr, "-d '{}' "+endpoint+"\n") {
			t.Errorf("endpoint %q, hint: %s", endpoint, ran.stderr)
		}
		// What run printed is the URL to call with any HTTP client.
		req, _ := http.NewRequest(http.MethodPost, endpoint, strings.NewReader(`{}`))
		req.Header.Set("Authorization", "Bearer "+s.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"echo":{}`) {
			t.Errorf("POST to the endpoint: %d %s", resp.StatusCode, body)
		}
	}
	if out := s.ok(t, "invoke", "echo"); !strings.Contains(out, `"echo":{}`) {
		t.Errorf("the hint's stoke invoke: %q", out)
	}
	r := stoke(t, s.env(), "", "invoke", "echo", "-d", `{"hello":"world"}`, "-v")
	if r.code != 0 || r.stdout != `{"echo":{"hello":"world"},"bytes":17,"runtime":"bash"}`+"\n" || !strings.Contains(r.stderr, "stoke: output INPUT_BYTES=17") {
		t.Errorf("invoke: %s", r)
	}
	input := filepath.Join(t.TempDir(), "in.json")
	if err := os.WriteFile(input, []byte(`[1,2]`), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := s.ok(t, "invoke", "echo", "-d", "@"+input); !strings.Contains(out, `"echo":[1,2]`) {
		t.Errorf("invoke -d @file: %q", out)
	}
	if r := stoke(t, s.env(), `"from stdin"`, "invoke", "echo", "-d", "-", "--invocation-id", "cli-inv-1", "-v"); r.code != 0 ||
		!strings.Contains(r.stdout, `"echo":"from stdin"`) || !strings.Contains(r.stderr, "invocation cli-inv-1") {
		t.Errorf("invoke -d -: %s", r)
	}
	r = stoke(t, s.env(), "", "logs", "echo")
	if r.code != 0 || !strings.Contains(r.stderr, "bash-echo: got 17 bytes") {
		t.Errorf("logs: %s", r)
	}
	s.fails(t, 1, "-d is not valid JSON", "invoke", "echo", "-d", "{nope")
}

func cliPythonFunction(t *testing.T, s *cliServer) {
	s.ok(t, "run", "--runtime", "python", "--source", "examples/python-hello", "--handler", "hello.handle", "--name", "hello", "-q")
	if s.dataplane {
		r := stoke(t, s.env(), "", "invoke", "hello", "-d", `{"name":"stoke"}`, "-v")
		var out struct{ Message, InvocationID string }
		if err := json.Unmarshal([]byte(r.stdout), &out); r.code != 0 || err != nil || out.Message != "hello, stoke" ||
			!strings.Contains(r.stderr, "stoke: output greeted=stoke") || !strings.Contains(r.stderr, "invocation "+out.InvocationID) {
			t.Errorf("invoke: %s", r)
		}
		r = s.fails(t, 1, "stoke: ValueError: name must be a non-empty string", "invoke", "hello", "-d", `{"name":3}`)
		if !strings.Contains(r.stderr, "Traceback") || r.stdout != "" {
			t.Errorf("handler failure: %s", r)
		}
	}
	s.fails(t, 1, "RegistrationFailed", "run", "--runtime", "python", "--source", "examples/python-hello", "--handler", "nomodule.handle")
	s.fails(t, 1, "is a task", "invoke", "specced")
}

// An invocation that runs past its timeout ends the command as a task's
// timeout does: exit 124 (it was 1).
func cliInvokeTimeout(t *testing.T, s *cliServer) {
	if !s.dataplane {
		t.Log("no gateway on this cluster: no invocations")
		return
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "slow.sh"), []byte("handle() { sleep 30; printf '{}'; }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.ok(t, "run", "--runtime", "bash", "--source", dir, "--handler", "slow.handle", "--name", "slow", "-q")
	r := s.fails(t, 124, "invoking run/slow", "invoke", "slow", "--timeout", "500ms")
	if r.stdout != "" {
		t.Errorf("a timed-out invoke printed %q", r.stdout)
	}
	s.ok(t, "delete", "slow")
}

func cliApply(t *testing.T, s *cliServer) {
	files := []string{"-f", "examples/runtime.yaml", "-f", "examples/task.yaml", "-f", "examples/bash-function.yaml", "-f", "examples/python-function.yaml"}
	want := "runtime/bash-small created\nrun/hello-task created\nrun/bash-echo created\nrun/python-hello created\n"
	if out := s.ok(t, append([]string{"apply"}, files...)...); out != want {
		t.Errorf("apply = %q, want %q", out, want)
	}
	if out := s.ok(t, append([]string{"apply"}, files...)...); out != strings.ReplaceAll(want, "created", "unchanged") {
		t.Errorf("apply again = %q", out)
	}
	if s.dataplane {
		r := stoke(t, s.env(), "", "logs", "-f", "hello-task")
		if r.code != 0 || r.stdout != "hi, stoke\n" || r.stderr != "task: greeted stoke\nstoke: run/hello-task Succeeded, exit code 0\n" {
			t.Errorf("logs -f hello-task: %s", r)
		}
	}
	// What get -o yaml prints applies as it is.
	yaml := s.ok(t, "get", "run", "hello-task", "-o", "yaml")
	if r := stoke(t, s.env(), yaml, "apply", "-f", "-"); r.code != 0 || r.stdout != "run/hello-task unchanged\n" {
		t.Errorf("apply of get -o yaml: %s", r)
	}
	changed := strings.Replace(yaml, "- stoke", "- someone", 1)
	if r := stoke(t, s.env(), changed, "apply", "-f", "-"); r.code != 1 || !strings.Contains(r.stderr, "run/hello-task: a run of this name exists with another spec") {
		t.Errorf("apply of a changed Run: %s", r)
	}
	// One bad document: nothing of the file is sent.
	bad := "apiVersion: stoke.dev/v1alpha1\nkind: Run\nmetadata: {name: not-sent}\nspec: {runtime: bash, mode: {task: {args: [true]}}}\n" +
		"---\napiVersion: stoke.dev/v1alpha1\nkind: Run\nmetadata: {name: bad}\nspec: {runtime: bash, mode: {task: {}}}\n"
	r := stoke(t, s.env(), bad, "apply", "-f", "-")
	if r.code != 1 || !strings.Contains(r.stderr, "standard input: document 2: run/bad: spec.mode.task: entrypoint or args must be set") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("apply of a bad document: %s", r)
	}
	s.fails(t, 1, "not found", "get", "run", "not-sent")
	// Many Runs are created concurrently: the output keeps file order,
	// and a refused Run in the middle does not stop the others.
	var many, wantOut strings.Builder
	for i := range 40 {
		name := fmt.Sprintf("many-%02d", i)
		if i == 20 {
			name = "hello-task" // exists, with another spec
		} else {
			fmt.Fprintf(&wantOut, "run/%s created\n", name)
		}
		fmt.Fprintf(&many, "---\napiVersion: stoke.dev/v1alpha1\nkind: Run\nmetadata: {name: %s, labels: {batch: many}}\nspec: {runtime: bash, mode: {task: {args: [true]}}}\n", name)
	}
	r = stoke(t, s.env(), many.String(), "apply", "-f", "-")
	if r.code != 1 || r.stdout != wantOut.String() || !strings.Contains(r.stderr, "run/hello-task: a run of this name exists with another spec") ||
		!strings.Contains(r.stderr, "1 of 40 objects were not applied") {
		t.Errorf("apply of 40 Runs, one refused: %s", r)
	}
	for _, name := range []string{"many-00", "many-19", "many-21", "many-39"} {
		s.ok(t, "get", "run", name)
	}
	if s.dataplane {
		if out := s.ok(t, "invoke", "bash-echo", "-d", `{"applied":true}`); !strings.Contains(out, `"echo":{"applied":true}`) {
			t.Errorf("invoke bash-echo: %q", out)
		}
	}
}

func cliGetDescribe(t *testing.T, s *cliServer) {
	out := s.ok(t, "get", "runs", "-o", "wide")
	if !strings.HasPrefix(out, "NAME ") || !strings.Contains(out, "ENDPOINT") || !strings.Contains(out, "/runs/echo/") {
		t.Errorf("get runs -o wide:\n%s", out)
	}
	if out := s.ok(t, "get", "runs", "-A"); !strings.HasPrefix(out, "NAMESPACE ") {
		t.Errorf("get runs -A:\n%s", out)
	}
	var list v1alpha1.RunList
	if err := json.Unmarshal([]byte(s.ok(t, "get", "runs", "-o", "json")), &list); err != nil || list.Kind != "RunList" || len(list.Items) < 5 {
		t.Errorf("get runs -o json: %v, kind %q, %d items", err, list.Kind, len(list.Items))
	}
	if out := s.ok(t, "get", "runtimes"); !strings.Contains(out, "bash-small") || !strings.Contains(out, "READY") {
		t.Errorf("get runtimes:\n%s", out)
	}
	if out := s.ok(t, "get", "runtimes", "-A"); !strings.HasPrefix(out, "NAMESPACE ") || !strings.Contains(out, "bash-small") {
		t.Errorf("get runtimes -A:\n%s", out)
	}
	if s.dataplane {
		// hello-task has ended, which its log says (on a cluster, read
		// through the gateway); without it the task may still run.
		out = s.ok(t, "describe", "run", "hello-task")
		for _, want := range []string{"Name:", "hello-task", "Phase:", "Succeeded", "Outputs:", "GREETED=stoke", "Exit code:", "Conditions:"} {
			if !strings.Contains(out, want) {
				t.Errorf("describe run lacks %q:\n%s", want, out)
			}
		}
	}
	if out := s.ok(t, "describe", "echo"); !strings.Contains(out, "Endpoint:") || !strings.Contains(out, "stoke invoke echo") {
		t.Errorf("describe of a function:\n%s", out)
	}
	if out := s.ok(t, "describe", "runtime/python"); !strings.Contains(out, "Server:") || (s.standalone() && !strings.Contains(out, "Pods:")) {
		t.Errorf("describe runtime:\n%s", out)
	}
}

// get -w prints every change until Ctrl-C, a deletion as one: a deleted
// Run's row says Deleted (it was printed again as it was last seen).
func cliGetWatch(t *testing.T, s *cliServer) {
	w, lines, stderr := startStoke(t, s.env(), "get", "runs", "-w", "-o", "json")
	s.ok(t, "run", "--runtime", "bash", "--name", "watched", "--detach", "--", "true")
	awaitLine(t, lines, "watched to succeed", func(l string) bool {
		var r v1alpha1.Run
		return json.Unmarshal([]byte(l), &r) == nil && r.Name == "watched" && r.Status.Phase == v1alpha1.PhaseSucceeded
	})
	if err := w.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := exitCode(t, w); code != 130 || stderr.Len() != 0 {
		t.Errorf("get -w after SIGINT: exit %d, stderr %q", code, stderr)
	}

	table, rows, _ := startStoke(t, s.env(), "get", "runs", "watched", "-w")
	awaitLine(t, rows, "watched's row", func(l string) bool { return strings.HasPrefix(l, "watched ") })
	events, evLines, _ := startStoke(t, s.env(), "get", "runs", "watched", "-w", "-o", "name", "--output-watch-events")
	awaitLine(t, evLines, "watched's ADDED event", func(l string) bool { return l == "ADDED run/watched" })
	s.ok(t, "delete", "watched")
	awaitLine(t, rows, "watched's row as deleted", func(l string) bool {
		f := strings.Fields(l)
		return len(f) > 3 && f[0] == "watched" && f[3] == "Deleted"
	})
	awaitLine(t, evLines, "watched's DELETED event", func(l string) bool { return l == "DELETED run/watched" })
	for _, c := range []*exec.Cmd{table, events} {
		if err := c.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		if code := exitCode(t, c); code != 130 {
			t.Errorf("%q after SIGINT: exit %d", c.Args, code)
		}
	}
}

func cliInterrupt(t *testing.T, s *cliServer) {
	if !s.dataplane {
		t.Log("no gateway on this cluster: run follows a task's log through it")
		return
	}
	run, lines, stderr := startStoke(t, s.env(), "run", "--runtime", "bash", "--name", "interrupted", "--", "bash", "-c", "echo started; sleep 60")
	awaitLine(t, lines, "the task to start", func(l string) bool { return l == "started" })
	if err := run.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := exitCode(t, run); code != 130 || !strings.Contains(stderr.String(), "stoke: interrupted; cancelled run/interrupted") {
		t.Errorf("run after SIGINT: exit %d, stderr %q", code, stderr)
	}
	if out := s.ok(t, "cancel", "interrupted", "--wait"); !strings.Contains(out, "Cancelled") {
		t.Errorf("cancel --wait of the interrupted Run: %q", out)
	}
}

func cliCancelDelete(t *testing.T, s *cliServer) {
	s.ok(t, "run", "--runtime", "bash", "--name", "sleeper", "-d", "--", "sleep", "60")
	if out := s.ok(t, "cancel", "sleeper", "--wait"); out != "run/sleeper Cancelled\n" {
		t.Errorf("cancel --wait = %q", out)
	}
	if out := s.ok(t, "delete", "sleeper", "--wait"); out != "run/sleeper deleted\n" {
		t.Errorf("delete --wait = %q", out)
	}
	s.fails(t, 1, "not found", "get", "run", "sleeper")
	if out := s.ok(t, "delete", "run/echo", "--wait"); out != "run/echo deleted\n" {
		t.Errorf("delete of a function = %q", out)
	}
	s.fails(t, 1, "not found", "invoke", "echo")
	if out := s.ok(t, "delete", "runtime", "bash-small"); out != "runtime/bash-small deleted\n" {
		t.Errorf("delete runtime = %q", out)
	}
}

// delete takes what kubectl delete takes: several names (it took one,
// and "stoke delete batch-00 batch-01" answered `"batch-00" is not a
// resource`), KIND NAME..., -l SELECTOR and -f FILE; a name that is not
// there is reported and the rest are deleted.
func cliDeleteMany(t *testing.T, s *cliServer) {
	for _, n := range []string{"batch-00", "batch-01", "batch-02"} {
		s.ok(t, "run", "--runtime", "bash", "--name", n, "--detach", "--", "true")
	}
	if out := s.ok(t, "delete", "batch-00", "batch-01"); out != "run/batch-00 deleted\nrun/batch-01 deleted\n" {
		t.Errorf("delete of two names = %q", out)
	}
	r := stoke(t, s.env(), "", "delete", "run", "batch-02", "no-such-run", "--wait")
	if r.code != 1 || r.stdout != "run/batch-02 deleted\n" || !strings.Contains(r.stderr, "run/no-such-run: ") || !strings.Contains(r.stderr, "1 of 2 objects were not deleted") {
		t.Errorf("delete run batch-02 no-such-run: %s", r)
	}
	s.fails(t, 1, "not found", "get", "run", "batch-02")
	if out := s.ok(t, "delete", "no-such-run", "--ignore-not-found"); out != "" {
		t.Errorf("delete --ignore-not-found = %q", out)
	}

	// -l: the Runs "apply" labelled batch=many (39 of them).
	out := s.ok(t, "delete", "-l", "batch=many")
	if n := strings.Count(out, " deleted\n"); n != 39 || !strings.Contains(out, "run/many-00 deleted\n") {
		t.Errorf("delete -l batch=many deleted %d:\n%s", n, out)
	}
	if out := s.ok(t, "get", "runs", "-l", "batch=many", "-o", "name"); out != "" {
		t.Errorf("after delete -l: %q", out)
	}

	// -f: the objects of a manifest, Runs and Runtimes alike.
	if out := s.ok(t, "delete", "-f", "examples/task.yaml", "-f", "examples/bash-function.yaml", "-f", "examples/python-function.yaml", "--wait"); out != "run/hello-task deleted\nrun/bash-echo deleted\nrun/python-hello deleted\n" {
		t.Errorf("delete -f = %q", out)
	}
	s.fails(t, 1, "not found", "get", "run", "bash-echo")
}

func cliErrors(t *testing.T, s *cliServer) {
	type tc struct {
		env  []string
		args []string
		want string
	}
	cases := []tc{
		{s.env(), []string{"get", "pods"}, `"pods" is not a resource`},
		{s.env(), []string{"run", "--runtime", "nope", "--", "true"}, `no Runtime "nope"`},
		{s.env(), []string{"run", "--runtime", "bash"}, "give a program"},
		{s.env(), []string{"describe", "no-such-run"}, "not found"},
		{s.env(), []string{"get", "runs", "-o", "xml"}, `"xml" is not a format`},
		{s.env(), []string{"delete"}, "name what to delete"},
	}
	if s.standalone() {
		cases = append(cases,
			tc{[]string{"STOKE_SERVER=http://127.0.0.1:1", "STOKE_TOKEN=x"}, []string{"get", "runs"}, `cannot reach the Stoke server at http://127.0.0.1:1`},
			tc{[]string{"STOKE_SERVER=http://127.0.0.1:1", "STOKE_TOKEN=x"}, []string{"get", "runs"}, `is "stoke up" running?`},
			tc{[]string{"STOKE_SERVER=" + s.URL, "STOKE_TOKEN=wrong"}, []string{"get", "runs"}, "the server refused the API token"},
			tc{[]string{"STOKE_SERVER=" + s.URL, "STOKE_DATA_DIR=" + t.TempDir()}, []string{"get", "runs"}, "no API token"},
		)
	} else {
		cases = append(cases,
			tc{s.env(), []string{"get", "runs", "--context", "nope"}, `context "nope" does not exist`},
		)
	}
	for _, tc := range cases {
		r := stoke(t, tc.env, "", tc.args...)
		if r.code != 1 || !strings.Contains(r.stderr, tc.want) || strings.Count(r.stderr, "\n") != 1 || !strings.HasPrefix(r.stderr, "stoke: ") {
			t.Errorf("stoke %s: want exit 1 and one line with %q, got %s", strings.Join(tc.args, " "), tc.want, r)
		}
	}
}

func cliHelpCompletion(t *testing.T, s *cliServer) {
	for _, c := range []string{"run", "apply", "get", "describe", "logs", "invoke", "cancel", "delete"} {
		if out := s.ok(t, c, "--help"); !strings.Contains(out, "Examples:") || !strings.Contains(out, "stoke "+c) {
			t.Errorf("stoke %s --help has no examples:\n%s", c, out)
		}
	}
	if out := s.ok(t, "completion", "bash"); !strings.Contains(out, "__start_stoke") {
		t.Errorf("completion bash: %.200q", out)
	}
	// Names complete from the server.
	s.ok(t, "run", "--runtime", "bash", "--name", "done-task", "--detach", "--", "true")
	s.awaitRunPhase(t, "done-task", v1alpha1.PhaseSucceeded)
	if out := s.ok(t, "__complete", "describe", "run", "done-"); !strings.Contains(out, "done-task\n") {
		t.Errorf("completion of Run names:\n%s", out)
	}
	if out := s.ok(t, "__complete", "get", ""); !strings.Contains(out, "runs\nruntimes\n") {
		t.Errorf("completion of get:\n%s", out)
	}
	// invoke and exec offer only the Runs they can reach: a Ready
	// function (hello), not an ended task; exec a Ready function or a
	// running task (they offered every Run).
	s.ok(t, "run", "--runtime", "bash", "--name", "long-task", "--detach", "--", "sleep", "120")
	s.awaitRunPhase(t, "long-task", v1alpha1.PhaseRunning)
	for _, tc := range []struct {
		args        []string
		want, never []string
	}{
		{[]string{"invoke", ""}, []string{"hello\n"}, []string{"done-task\n", "long-task\n", "specced\n"}},
		{[]string{"exec", ""}, []string{"hello\n", "long-task\n"}, []string{"done-task\n", "specced\n"}},
		{[]string{"logs", ""}, []string{"hello\n", "long-task\n", "done-task\n"}, nil},
	} {
		out := s.ok(t, append([]string{"__complete"}, tc.args...)...)
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("completion of %q lacks %q:\n%s", tc.args, w, out)
			}
		}
		for _, n := range tc.never {
			if strings.Contains(out, n) {
				t.Errorf("completion of %q offers %q:\n%s", tc.args, n, out)
			}
		}
	}
	s.ok(t, "delete", "long-task", "done-task")
}

// stoke controller probe and stoke runtimed probe take the same flag for
// their socket, --probe-socket (runtimed's was --socket, kept as a
// deprecated alias).
func cliProbeFlags(t *testing.T, s *cliServer) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	for _, args := range [][]string{
		{"controller", "probe", "--probe-socket", sock},
		{"runtimed", "probe", "--probe-socket", sock},
		{"runtimed", "probe", "--socket", sock},
	} {
		r := stoke(t, nil, "", args...)
		if r.code != 1 || !strings.Contains(r.stderr, sock) || strings.Contains(r.stderr, "unknown flag") {
			t.Errorf("stoke %s: want exit 1 naming the socket, got %s", strings.Join(args, " "), r)
		}
	}
}

// cliExec: stoke exec into a running task as kubectl exec behaves: the
// command's exit status and separate streams, stdin with -i, and with -it
// a real terminal (resize, ^C to the remote foreground, exit status). On a
// cluster the session goes through the API server to the gateway (a
// WebSocket upgrade through the aggregator) and on to the Run's Pod.
func cliExec(t *testing.T, s *cliServer) {
	if !s.standalone() && !s.dataplane {
		t.Log("no gateway on this cluster: no exec")
		return
	}
	s.ok(t, "run", "--runtime", "bash", "--name", "exec-target", "--detach", "--", "sleep", "100000")
	s.awaitRunPhase(t, "exec-target", v1alpha1.PhaseRunning)
	r := stoke(t, s.env(), "", "exec", "exec-target", "--", "sh", "-c", "echo out; echo err >&2; exit 3")
	if r.code != 3 || r.stdout != "out\n" || r.stderr != "err\n" {
		t.Errorf("exec: %s; want exit 3, out and err apart", r)
	}
	if r := stoke(t, s.env(), "hello", "exec", "-i", "exec-target", "--", "wc", "-c"); r.code != 0 || r.stdout != "5\n" {
		t.Errorf("exec -i: %s", r)
	}
	execTerminal(t, s.env(), "exec-target")
	s.ok(t, "delete", "--wait", "exec-target")
}
