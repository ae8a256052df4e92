package python

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// Every worker's goroutines (its exit watcher and two log pumps) must be
// gone once Close returns.
func TestMain(m *testing.M) {
	if os.Getenv("STOKE_TEST_SPARE_KEEPER") != "" {
		spareKeeper()
	}
	goleak.VerifyTestMain(m)
}
