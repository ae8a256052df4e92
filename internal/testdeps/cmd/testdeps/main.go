// Command testdeps builds the test dependency sets named on its command
// line (all of them without arguments: the tools, kube and s3 sets) into
// the user's cache directory, each set's build beside the others', and
// prints their directories; .ci/run uses it to build them before the
// tests.
package main

import (
	"fmt"
	"os"
	"sync"

	"stoke.dev/stoke/internal/testdeps"
)

func main() {
	names := os.Args[1:]
	if len(names) == 0 {
		names = testdeps.Sets()
	}
	// At the same time: a go build leaves cores idle while it links one
	// program after another, and the kube set's links are long.
	dirs := make([]string, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Go(func() { dirs[i], errs[i] = testdeps.Dir(n) })
	}
	wg.Wait()
	failed := false
	for i := range names {
		if errs[i] != nil {
			fmt.Fprintln(os.Stderr, errs[i])
			failed = true
			continue
		}
		fmt.Println(dirs[i])
	}
	if failed {
		os.Exit(1)
	}
}
