package kubetest

import (
	"fmt"
	"os"
	"sync"
	"testing"
)

// shared is the cluster of a test binary whose TestMain calls Main.
var shared struct {
	sync.Mutex
	main  bool    // Main is running the tests
	opts  Options // Main's
	c     *Cluster
	err   error // the start's, returned to every later Shared
	begun bool
}

// Main runs the test binary's tests with one cluster that they share,
// started by the first Shared call (none if no test calls it) and stopped
// after the last test. Call it from TestMain:
//
//	func TestMain(m *testing.M) { kubetest.Main(m, kubetest.Options{ControllerManager: true, Scheduler: true}) }
//
// Tests sharing a cluster keep to namespaces of their own (Namespace); one
// that stops the API server or needs other Options starts its own.
func Main(m *testing.M, opts Options) {
	os.Exit(runMain(m, opts))
}

func runMain(m *testing.M, opts Options) int {
	shared.Lock()
	shared.main, shared.opts = true, opts
	shared.Unlock()
	code := m.Run()
	shared.Lock()
	defer shared.Unlock()
	if c := shared.c; c != nil {
		if err := c.stop(); err != nil {
			fmt.Fprintf(os.Stderr, "kubetest: %v\n", err)
			code = 1
		}
		if code != 0 {
			fmt.Fprintf(os.Stderr, "kubetest: the shared cluster's logs:%s\n", c.logTails(60))
		}
		_ = os.RemoveAll(c.Dir)
	}
	return code
}

// Shared returns the test binary's shared cluster, starting it on first
// use; the binary's TestMain must call Main.
func Shared(t testing.TB) *Cluster {
	t.Helper()
	shared.Lock()
	defer shared.Unlock()
	if !shared.main {
		t.Fatal("kubetest.Shared: the test binary's TestMain does not call kubetest.Main")
	}
	if !shared.begun {
		shared.begun = true
		dir, err := os.MkdirTemp("", "kubetest-")
		if err == nil {
			shared.c, err = start(shared.opts, dir)
			if err != nil {
				_ = os.RemoveAll(dir)
			}
		}
		shared.err = err
	}
	if shared.err != nil {
		t.Fatalf("kubetest: the shared cluster: %v", shared.err)
	}
	return shared.c
}
