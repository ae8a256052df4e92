package python

import (
	"testing"

	"go.uber.org/goleak"
)

// Every worker's goroutines (its exit watcher and two log pumps) must be
// gone once Close returns.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
