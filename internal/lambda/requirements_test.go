package lambda_test

import (
	"context"
	"strings"
	"testing"
	"time"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/lambda"
	"stoke.dev/stoke/internal/pydeps"
	"stoke.dev/stoke/internal/pydeps/pydepstest"
	"stoke.dev/stoke/internal/runtime/runtimetest"
	"stoke.dev/stoke/internal/runtime/server"
)

// A python function on Lambda whose source holds a requirements.txt gets
// what it lists in its package (installed for Lambda's platform, through
// the requirements cache), and imports it; requirements pip cannot
// install end the registration with pip's message, before any function
// is created.
func TestPythonRequirementsGoIntoThePackage(t *testing.T) {
	links := t.TempDir()
	if _, err := pydepstest.Wheel(links, "tinydep", "1.0", "VALUE = 'from tinydep'\n"); err != nil {
		t.Fatal(err)
	}
	sim := simulator(t)
	srv := newServerWith(t, sim, "python", func(c *lambda.Config) {
		c.PythonDeps = pydeps.Config{Root: t.TempDir(), FindLinks: links}
	})
	rs := runtimetest.StartServer(t, runtimetest.Harness{Runtime: "lambda"}, func(c *server.Config) { serve(c, srv) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	register := func(uid, reqs string) (*pb.RegisterFunctionResponse, string) {
		dir := rs.Dir(t, runtimetest.Source{Files: map[string]string{
			"handler.py":       "import tinydep\n\ndef handle(event, context):\n    return tinydep.VALUE\n",
			"requirements.txt": reqs,
		}})
		resp, err := rs.Functions.RegisterFunction(ctx, &pb.RegisterFunctionRequest{RunUid: uid, RegistrationAttempt: 1, WorkingDir: dir,
			Handler: "handler.handle", IdleTimeoutSeconds: 300, RegistrationDigest: runtimetest.Digest(uid)})
		if err != nil {
			t.Fatal(err)
		}
		st, err := rs.Functions.FunctionStatus(ctx, &pb.FunctionStatusRequest{Registration: resp.GetRegistration()})
		if err != nil {
			t.Fatal(err)
		}
		return resp, st.GetFatalError()
	}
	resp, fatal := register("lambda-deps", "tinydep==1.0\n")
	if resp.GetState() != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_READY {
		t.Fatalf("state %v: %s", resp.GetState(), fatal)
	}
	out, err := rs.Invoke(ctx, resp.GetRegistration(), "{}", 30_000)
	if err != nil || string(out.GetOutput()) != `"from tinydep"` {
		t.Fatalf("invoke: %v, %v; want \"from tinydep\"", out, err)
	}
	creates := sim.CreateCalls()
	resp, fatal = register("lambda-deps-bad", "nosuchdep==2.0\n")
	if resp.GetState() != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_FAILED || !strings.Contains(fatal, "No matching distribution found for nosuchdep==2.0") {
		t.Fatalf("state %v, fatal_error %q; want FAILED with pip's message", resp.GetState(), fatal)
	}
	if sim.CreateCalls() != creates {
		t.Fatalf("a function was created for requirements that cannot install")
	}
}
