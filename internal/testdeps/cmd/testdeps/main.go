// Command testdeps builds the test dependencies named on its command line
// (all of them without arguments) into the user's cache directory and
// prints their paths; .ci/run uses it to build them before the tests.
package main

import (
	"fmt"
	"os"

	"stoke.dev/stoke/internal/testdeps"
)

func main() {
	names := os.Args[1:]
	if len(names) == 0 {
		names = testdeps.Names()
	}
	for _, n := range names {
		p, err := testdeps.Path(n)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(p)
	}
}
