package bash

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test starts real bash processes and goroutines that must all be
// gone once its instances are closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
