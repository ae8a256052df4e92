package server_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"stoke.dev/stoke/internal/runtime/runtimetest"
)

func TestMain(m *testing.M) {
	// A variable of the server's own environment that no handler may see.
	os.Setenv(runtimetest.ServerSecretEnv, "must-not-leak")
	goleak.VerifyTestMain(m)
}

func TestContractBash(t *testing.T) {
	t.Parallel()
	runtimetest.Run(t, runtimetest.Bash("bash"))
}

func TestContractPython(t *testing.T) {
	t.Parallel()
	runtimetest.Run(t, runtimetest.Python("python"))
}
