package python

import (
	"regexp"
	"testing"

	"stoke.dev/stoke/internal/errdefs"
)

// TestWorkerRuntimeErrorTypes checks that every Runtime.* error type the
// worker sends is one of errdefs', which the Go side and the docs use.
func TestWorkerRuntimeErrorTypes(t *testing.T) {
	known := map[string]bool{}
	for _, typ := range []string{errdefs.RuntimeExitError, errdefs.RuntimeProtocolError, errdefs.RuntimeInvalidInput,
		errdefs.RuntimeInvalidOutput, errdefs.RuntimeInvalidOutputs, errdefs.RuntimeOutputTooLarge} {
		known[typ] = true
	}
	found := regexp.MustCompile(`'(Runtime\.[A-Za-z]+)'`).FindAllStringSubmatch(workerSource, -1)
	if len(found) == 0 {
		t.Fatal("worker.py sends no Runtime.* error type: the pattern is stale")
	}
	for _, m := range found {
		if !known[m[1]] {
			t.Errorf("worker.py sends %s, which errdefs does not define", m[1])
		}
	}
}
