// Command testdeps builds the test dependency sets named on its command
// line (all of them without arguments: the tools set and the kube set) into
// the user's cache directory and prints their directories; .ci/run uses it
// to build them before the tests.
package main

import (
	"fmt"
	"os"

	"stoke.dev/stoke/internal/testdeps"
)

func main() {
	names := os.Args[1:]
	if len(names) == 0 {
		names = testdeps.Sets()
	}
	for _, n := range names {
		dir, err := testdeps.Dir(n)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(dir)
	}
}
