package lambdasim_test

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"

	"stoke.dev/stoke/internal/lambda/lambdasim"
	"stoke.dev/stoke/internal/testdeps"
)

var rieBin string

func TestMain(m *testing.M) {
	var err error
	if rieBin, err = testdeps.Path("aws-lambda-rie"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

const accessKey = "AKIDSIMULATOR"

func start(t *testing.T, concurrency int) (*lambdasim.Simulator, *lambda.Client) {
	t.Helper()
	sim, err := lambdasim.New(lambdasim.Config{RIE: rieBin, Dir: t.TempDir(), AccessKeyID: accessKey, Concurrency: concurrency})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	return sim, client(sim.URL(), accessKey)
}

func client(url, key string) *lambda.Client {
	return lambda.New(lambda.Options{
		Region:       lambdasim.Region,
		BaseEndpoint: aws.String(url),
		Credentials:  credentials.NewStaticCredentialsProvider(key, "secret", ""),
	})
}

// pkg zips pyBootstrap as bootstrap.
func pkg(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	hdr := &zip.FileHeader{Name: "bootstrap", Method: zip.Deflate}
	hdr.SetMode(0o755)
	w, err := zw.CreateHeader(hdr)
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte(pyBootstrap))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

const pyBootstrap = `#!/usr/bin/env python3
import json, os, time, urllib.request
api = "http://" + os.environ["AWS_LAMBDA_RUNTIME_API"] + "/2018-06-01/runtime"
def post(path, body, error_type=None):
    req = urllib.request.Request(api + path, data=json.dumps(body).encode(), method="POST")
    if error_type:
        req.add_header("Lambda-Runtime-Function-Error-Type", error_type)
    urllib.request.urlopen(req).read()
if os.environ.get("_HANDLER") == "missing":
    post("/init/error", {"errorType": "Runtime.InitError", "errorMessage": "handler missing not found"}, "Runtime.InitError")
    raise SystemExit(1)
calls = 0
while True:
    with urllib.request.urlopen(api + "/invocation/next") as r:
        rid = r.headers["Lambda-Runtime-Aws-Request-Id"]
        event = json.loads(r.read() or b"null")
    calls += 1
    if isinstance(event, dict) and event.get("started"):
        with open(event["started"], "w") as f:
            f.write("x\\n")
        fd = os.open(event["release"], os.O_RDONLY)
        os.read(fd, 3)
        os.close(fd)
    if isinstance(event, dict) and event.get("sleep"):
        time.sleep(event["sleep"])
    if isinstance(event, dict) and event.get("fail"):
        post("/invocation/" + rid + "/error", {"errorType": "ValueError", "errorMessage": "asked to fail"}, "ValueError")
        continue
    print("handled", calls, flush=True)
    post("/invocation/" + rid + "/response", {"calls": calls, "echo": event})
`

func create(t *testing.T, c *lambda.Client, name, handler string, timeout int32) {
	t.Helper()
	ctx := context.Background()
	_, err := c.CreateFunction(ctx, &lambda.CreateFunctionInput{
		FunctionName: aws.String(name),
		Runtime:      types.RuntimeProvidedal2023,
		Role:         aws.String("arn:aws:iam::123456789012:role/stoke"),
		Handler:      aws.String(handler),
		Timeout:      aws.Int32(timeout),
		Code:         &types.FunctionCode{ZipFile: pkg(t)},
		Environment:  &types.Environment{Variables: map[string]string{"STOKE_RUNTIME": "python"}},
		Tags:         map[string]string{"stoke.dev/run-uid": "uid-1"},
	})
	if err != nil {
		t.Fatalf("CreateFunction: %v", err)
	}
	w := lambda.NewFunctionActiveV2Waiter(c, func(o *lambda.FunctionActiveV2WaiterOptions) { o.MinDelay = 20 * time.Millisecond })
	if err := w.Wait(ctx, &lambda.GetFunctionInput{FunctionName: aws.String(name)}, 30*time.Second); err != nil {
		t.Fatalf("waiting for Active: %v", err)
	}
}

func invoke(t *testing.T, c *lambda.Client, name string, input any) *lambda.InvokeOutput {
	t.Helper()
	ev, _ := json.Marshal(input)
	out, err := c.Invoke(context.Background(), &lambda.InvokeInput{FunctionName: aws.String(name), Payload: ev, LogType: types.LogTypeTail})
	if err != nil {
		t.Fatalf("Invoke: %v", err)
	}
	return out
}

func TestLifecycleWithTheRealSDK(t *testing.T) {
	sim, c := start(t, 10)
	ctx := context.Background()
	create(t, c, "fn-a", "h.handle", 10)

	// A second create conflicts.
	_, err := c.CreateFunction(ctx, &lambda.CreateFunctionInput{FunctionName: aws.String("fn-a"), Runtime: types.RuntimeProvidedal2023,
		Role: aws.String("arn:aws:iam::123456789012:role/stoke"), Code: &types.FunctionCode{ZipFile: pkg(t)}})
	var conflict *types.ResourceConflictException
	if !errors.As(err, &conflict) {
		t.Fatalf("second CreateFunction = %v; want ResourceConflictException", err)
	}

	conf, err := c.GetFunctionConfiguration(ctx, &lambda.GetFunctionConfigurationInput{FunctionName: aws.String("fn-a")})
	if err != nil || conf.State != types.StateActive || aws.ToString(conf.Handler) != "h.handle" {
		t.Fatalf("GetFunctionConfiguration = %+v, %v", conf, err)
	}
	fn, err := c.GetFunction(ctx, &lambda.GetFunctionInput{FunctionName: aws.String("fn-a")})
	if err != nil || fn.Tags["stoke.dev/run-uid"] != "uid-1" {
		t.Fatalf("GetFunction tags = %v, %v", fn, err)
	}

	// Warm: module globals survive from one invocation to the next.
	for want := 1; want <= 3; want++ {
		out := invoke(t, c, "fn-a", map[string]int{"n": want})
		var resp struct{ Calls int }
		if out.FunctionError != nil || json.Unmarshal(out.Payload, &resp) != nil || resp.Calls != want {
			t.Fatalf("invocation %d = %s (function error %v)", want, out.Payload, aws.ToString(out.FunctionError))
		}
		logs, _ := base64.StdEncoding.DecodeString(aws.ToString(out.LogResult))
		if !strings.Contains(string(logs), "RequestId") {
			t.Errorf("LogType Tail gave %q; want the invocation's log lines", logs)
		}
	}
	if n := sim.Sandboxes("fn-a"); n != 1 {
		t.Errorf("sequential invocations used %d sandboxes; want 1 warm one", n)
	}

	// A handler error: X-Amz-Function-Error with the handler's type.
	out := invoke(t, c, "fn-a", map[string]bool{"fail": true})
	var perr struct{ ErrorType, ErrorMessage string }
	if aws.ToString(out.FunctionError) != "Unhandled" || json.Unmarshal(out.Payload, &perr) != nil || perr.ErrorType != "ValueError" {
		t.Fatalf("failing invocation = %s, function error %q", out.Payload, aws.ToString(out.FunctionError))
	}

	// Tags.
	if _, err := c.TagResource(ctx, &lambda.TagResourceInput{Resource: fn.Configuration.FunctionArn, Tags: map[string]string{"k": "v"}}); err != nil {
		t.Fatal(err)
	}
	tags, err := c.ListTags(ctx, &lambda.ListTagsInput{Resource: fn.Configuration.FunctionArn})
	if err != nil || tags.Tags["k"] != "v" || tags.Tags["stoke.dev/run-uid"] != "uid-1" {
		t.Fatalf("ListTags = %v, %v", tags, err)
	}
	if _, err := c.UntagResource(ctx, &lambda.UntagResourceInput{Resource: fn.Configuration.FunctionArn, TagKeys: []string{"k"}}); err != nil {
		t.Fatal(err)
	}

	list, err := c.ListFunctions(ctx, &lambda.ListFunctionsInput{})
	if err != nil || len(list.Functions) != 1 || aws.ToString(list.Functions[0].FunctionName) != "fn-a" {
		t.Fatalf("ListFunctions = %v, %v", list, err)
	}

	if _, err := c.DeleteFunction(ctx, &lambda.DeleteFunctionInput{FunctionName: aws.String("fn-a")}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("fn-a"), Payload: []byte(`{}`)})
	var nf *types.ResourceNotFoundException
	if !errors.As(err, &nf) {
		t.Fatalf("Invoke after delete = %v; want ResourceNotFoundException", err)
	}
	if got := sim.Functions(); len(got) != 0 {
		t.Fatalf("functions after delete: %v", got)
	}
}

func TestWrongCredentialsAreRefused(t *testing.T) {
	sim, _ := start(t, 1)
	_, err := client(sim.URL(), "AKIDOTHER").ListFunctions(context.Background(), &lambda.ListFunctionsInput{})
	if err == nil || !strings.Contains(err.Error(), "UnrecognizedClientException") {
		t.Fatalf("ListFunctions with another key = %v; want UnrecognizedClientException", err)
	}
}

func TestConcurrencyLimitAndMoreSandboxes(t *testing.T) {
	sim, c := start(t, 2)
	create(t, c, "fn-c", "h.handle", 60)
	started, release := blockers(t)
	// Two invocations that block in their handler occupy the limit.
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ev, _ := json.Marshal(map[string]string{"started": started.Name(), "release": release.Name()})
			out, err := c.Invoke(context.Background(), &lambda.InvokeInput{FunctionName: aws.String("fn-c"), Payload: ev})
			if err == nil && out.FunctionError != nil {
				err = fmt.Errorf("function error: %s", out.Payload)
			}
			errs <- err
		}()
	}
	awaitLines(t, started, 2)
	_, err := c.Invoke(context.Background(), &lambda.InvokeInput{FunctionName: aws.String("fn-c"), Payload: []byte(`{}`)},
		func(o *lambda.Options) { o.RetryMaxAttempts = 1 })
	var tooMany *types.TooManyRequestsException
	if !errors.As(err, &tooMany) {
		t.Errorf("a third invocation past the limit of 2 = %v; want TooManyRequestsException", err)
	}
	for range 2 {
		release.WriteString("go\n")
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("blocked invocation: %v", err)
		}
	}
	if n := sim.Sandboxes("fn-c"); n != 2 {
		t.Fatalf("two concurrent invocations used %d sandboxes; want 2", n)
	}
}

// blockers makes two FIFOs, held open read-write so that neither end ever
// sees EOF: handlers write a line to started when they run and wait for
// three bytes from release.
func blockers(t *testing.T) (started, release *os.File) {
	t.Helper()
	dir := t.TempDir()
	var files []*os.File
	for _, name := range []string{"started", "release"} {
		p := dir + "/" + name
		if err := syscall.Mkfifo(p, 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		files = append(files, f)
	}
	return files[0], files[1]
}

func awaitLines(t *testing.T, f *os.File, n int) {
	t.Helper()
	// A handler that never runs (its sandbox did not start) fails the
	// test rather than hanging it.
	if err := f.SetReadDeadline(time.Now().Add(2 * time.Minute)); err != nil {
		t.Fatal(err)
	}
	defer f.SetReadDeadline(time.Time{})
	buf := make([]byte, 0, 2*n)
	one := make([]byte, 2*n)
	for len(buf) < 2*n {
		k, err := f.Read(one[:2*n-len(buf)])
		if err != nil {
			t.Fatalf("waiting for %d handlers to start: %v", n, err)
		}
		buf = append(buf, one[:k]...)
	}
}

func TestTimeoutKillsTheSandbox(t *testing.T) {
	sim, c := start(t, 10)
	// 3 s: time for a fresh sandbox's first invocation on a loaded
	// machine, which the RIE bounds by the timeout as Lambda does.
	create(t, c, "fn-t", "h.handle", 3)
	// A cold invocation has Lambda's init limit on top of the timeout:
	// warm the sandbox first.
	invoke(t, c, "fn-t", map[string]int{"n": 0})
	out := invoke(t, c, "fn-t", map[string]float64{"sleep": 10})
	var perr struct{ ErrorType, ErrorMessage string }
	if aws.ToString(out.FunctionError) != "Unhandled" || json.Unmarshal(out.Payload, &perr) != nil || perr.ErrorType != "Sandbox.Timedout" {
		t.Fatalf("timed-out invocation = %s, function error %q", out.Payload, aws.ToString(out.FunctionError))
	}
	if n := sim.Sandboxes("fn-t"); n != 0 {
		t.Fatalf("%d sandboxes left after a timeout; want the timed-out one killed", n)
	}
	// The next invocation starts afresh.
	out = invoke(t, c, "fn-t", map[string]int{"n": 1})
	if out.FunctionError != nil || !strings.Contains(string(out.Payload), `"calls": 1`) {
		t.Fatalf("invocation after the timeout = %s", out.Payload)
	}
}

func TestInitErrorIsAFunctionError(t *testing.T) {
	_, c := start(t, 10)
	create(t, c, "fn-i", "missing", 10)
	out, err := c.Invoke(context.Background(), &lambda.InvokeInput{FunctionName: aws.String("fn-i"), Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	var perr struct{ ErrorType, ErrorMessage string }
	if aws.ToString(out.FunctionError) != "Unhandled" || json.Unmarshal(out.Payload, &perr) != nil ||
		perr.ErrorType != "Runtime.InitError" || !strings.Contains(perr.ErrorMessage, "missing") {
		t.Fatalf("ping of a missing handler = %s, function error %q", out.Payload, aws.ToString(out.FunctionError))
	}
}

// On Lambda the Runtime API listens before the runtime starts; the RIE
// starts its listener on a goroutine of its own, racing the first
// invocation, which starts the runtime: a bootstrap that asks for its
// first event at once was refused now and then under load, and exited
// (Runtime.ExitError, the CI failure of TestTasksOnLambda). The simulator
// sends no invocation before the Runtime API accepts. Each bootstrap here
// dials the Runtime API first thing, before Python's start-up, and exits
// if it is refused; many sandboxes start at once, to load the machine.
func TestRuntimeAPIListensBeforeTheRuntimeStarts(t *testing.T) {
	const n = 12
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			dir := t.TempDir()
			task := dir + "/task"
			bootstrap := "#!/usr/bin/env bash\n" +
				"exec 3<>/dev/tcp/${AWS_LAMBDA_RUNTIME_API%:*}/${AWS_LAMBDA_RUNTIME_API##*:} || { echo 'the Runtime API refused the runtime' >&2; exit 1; }\n" +
				"exec 3>&-\n" +
				"exec python3 \"$LAMBDA_TASK_ROOT/runtime.py\"\n"
			if err := os.Mkdir(task, 0o755); err != nil {
				errs <- err
				return
			}
			if err := os.WriteFile(task+"/bootstrap", []byte(bootstrap), 0o755); err != nil {
				errs <- err
				return
			}
			if err := os.WriteFile(task+"/runtime.py", []byte(pyBootstrap), 0o644); err != nil {
				errs <- err
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			sb, err := lambdasim.StartSandbox(ctx, rieBin, dir, task, nil)
			if err != nil {
				errs <- err
				return
			}
			out, err := sb.Invoke(ctx, []byte(fmt.Sprintf(`{"n":%d}`, i)))
			sb.Close()
			if err != nil {
				errs <- fmt.Errorf("sandbox %d: %w\n%s", i, err, sb.Logs())
				return
			}
			if !strings.Contains(string(out), fmt.Sprintf(`"n": %d`, i)) {
				errs <- fmt.Errorf("sandbox %d answered %s", i, out)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
