package lambda_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/lambda"
	"stoke.dev/stoke/internal/lambda/lambdasim"
	"stoke.dev/stoke/internal/runtime/runtimetest"
	"stoke.dev/stoke/internal/runtime/server"
)

// echoTwice registers the Echo fixture on rs and checks that it answers
// as on a local pod: the event back, and the module's globals kept warm
// across invocations.
func echoTwice(t *testing.T, rs *runtimetest.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	reg := rs.Register(t, runtimetest.Echo, "uid-echo")
	for want := 1; want <= 2; want++ {
		resp, err := rs.Invoke(ctx, reg, `{"hello":"lambda"}`, 0)
		if err != nil {
			t.Fatal(err)
		}
		if string(resp.GetOutput()) != `{"hello":"lambda"}` || resp.GetOutputs()["calls"] != string(rune('0'+want)) {
			t.Fatalf("invocation %d = %s, outputs %v", want, resp.GetOutput(), resp.GetOutputs())
		}
	}
}

// A Python function runs on Lambda's managed Python runtime, which has a
// python3, with Stoke's bootstrap started as its AWS_LAMBDA_EXEC_WRAPPER
// (the simulator starts the wrapper with the runtime's own command, as
// Lambda does): no layer needed.
func TestPythonOnTheManagedRuntime(t *testing.T) {
	e := start(t, "python", pythonFixtures)
	echoTwice(t, e.rs)
	fns := e.sim.Functions()
	if len(fns) != 1 {
		t.Fatalf("functions %v", fns)
	}
	c, _ := e.sim.Created(fns[0])
	if c.Runtime != lambda.ManagedPython || c.PackageType != "Zip" || c.Handler != "handler.handle" ||
		c.Env["AWS_LAMBDA_EXEC_WRAPPER"] != "/var/task/bootstrap" || c.Env["STOKE_RUNTIME"] != "python" {
		t.Fatalf("CreateFunction with %+v; want Runtime %s, Zip, the handler and AWS_LAMBDA_EXEC_WRAPPER=/var/task/bootstrap", c, lambda.ManagedPython)
	}
}

// A bash function stays on the OS-only runtime, which has bash.
func TestBashOnTheOSOnlyRuntime(t *testing.T) {
	e := start(t, "bash", map[runtimetest.Fixture]runtimetest.Source{
		runtimetest.Echo: src("h.sh", "h.handle", `handle() { printf '%s' "$1"; }`)})
	reg := e.rs.Register(t, runtimetest.Echo, "uid-bash")
	if resp, err := e.rs.Invoke(context.Background(), reg, `{"a":1}`, 0); err != nil || string(resp.GetOutput()) != `{"a":1}` {
		t.Fatalf("bash invocation: %v %v", resp, err)
	}
	c, _ := e.sim.Created(e.sim.Functions()[0])
	if c.Runtime != "provided.al2023" || c.Env["AWS_LAMBDA_EXEC_WRAPPER"] != "" {
		t.Fatalf("CreateFunction with %+v; want provided.al2023 without a wrapper", c)
	}
}

const testImage = lambdasim.Account + ".dkr.ecr." + lambdasim.Region + ".amazonaws.com/stoke-python:1"

// imageRoot lays out what the documented Dockerfile makes: the handler at
// LAMBDA_TASK_ROOT and Stoke's bootstrap at /opt/stoke/bootstrap (here the
// launcher of the test's stoke-lambda-bootstrap).
func imageRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	code := filepath.Join(root, "var", "task")
	boot := filepath.Join(root, filepath.FromSlash(lambda.ImageBootstrap))
	for _, d := range []string{code, filepath.Dir(boot)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	script, err := os.ReadFile(launcher)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(boot, script, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(code, "handler.py"), []byte(pythonFixtures[runtimetest.Echo].Files["handler.py"]), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

// A container-image function runs the user's image with Stoke's bootstrap
// as its entrypoint; the image holds the code, and a Run that brings
// source of its own is refused with a clear error.
func TestPythonImageFunction(t *testing.T) {
	sim := simulator(t, func(c *lambdasim.Config) {
		c.Images = map[string]lambdasim.Image{testImage: {Root: imageRoot(t)}}
	})
	srv := newServerWith(t, sim, "python", func(c *lambda.Config) { c.Image = testImage })
	rs := runtimetest.StartServer(t, runtimetest.Harness{
		Runtime: "lambda",
		Fixtures: func(f runtimetest.Fixture) runtimetest.Source {
			if f == runtimetest.Echo {
				return runtimetest.Source{Handler: "handler.handle"} // no source: the image's
			}
			return pythonFixtures[f]
		},
	}, func(c *server.Config) { serve(c, srv) })
	echoTwice(t, rs)
	fns := sim.Functions()
	if len(fns) != 1 {
		t.Fatalf("functions %v", fns)
	}
	c, _ := sim.Created(fns[0])
	if c.PackageType != "Image" || c.ImageURI != testImage || c.Runtime != "" || c.Handler != "" ||
		!slices.Equal(c.EntryPoint, []string{lambda.ImageBootstrap}) || c.Env["STOKE_HANDLER"] != "handler.handle" {
		t.Fatalf("CreateFunction with %+v; want PackageType Image, ImageUri %s, entrypoint %s and the handler in STOKE_HANDLER", c, testImage, lambda.ImageBootstrap)
	}

	// Source that would never reach the function is refused, before any
	// AWS call.
	_, st := register(t, env{sim: sim, rs: rs}, runtimetest.Fail, "uid-with-source")
	if st.GetState() != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_FAILED || !strings.Contains(st.GetFatalError(), "build it into the image") {
		t.Fatalf("a Run with source on an image Runtime: %v %q", st.GetState(), st.GetFatalError())
	}
	if n := sim.CreateCalls(); n != 1 {
		t.Fatalf("%d CreateFunction calls; want only the image function's", n)
	}
}
