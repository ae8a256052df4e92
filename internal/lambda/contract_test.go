package lambda_test

import (
	"testing"

	"stoke.dev/stoke/internal/runtime/runtimetest"
	"stoke.dev/stoke/internal/runtime/server"
)

// onLambda is h served by a Lambda Runtime Server running its code with
// the inner runtime on a simulator: what `stoke runtime-server --runtime
// lambda --lambda-runtime inner` serves.
func onLambda(h runtimetest.Harness, inner string) runtimetest.Harness {
	h.Configure = func(t testing.TB, c *server.Config) {
		serve(c, newServer(t, simulator(t), inner))
	}
	h.RunsACopy = "a Lambda function runs its deployment package, which Stoke builds from working_dir at registration, in the sandbox's task root"
	return h
}

// The shared contract suite, as the bash and python Runtime Servers pass it.

func TestContractPythonOnLambda(t *testing.T) {
	t.Parallel()
	runtimetest.Run(t, onLambda(runtimetest.Python("lambda"), "python"))
}

func TestContractBashOnLambda(t *testing.T) {
	t.Parallel()
	runtimetest.Run(t, onLambda(runtimetest.Bash("lambda"), "bash"))
}
