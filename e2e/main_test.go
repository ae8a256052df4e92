package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"stoke.dev/stoke/internal/testbin"
)

// Binaries built once for every test in the package.
var stokeBin, grpcurlBin, containerInitBin string

func TestMain(m *testing.M) {
	var cleanups []func()
	exit := func(code int) {
		for _, c := range cleanups {
			c()
		}
		os.Exit(code)
	}
	for _, b := range []struct {
		path         *string
		pkg, modfile string
	}{
		{&stokeBin, "stoke.dev/stoke/cmd/stoke", ""},
		// The pinned grpcurl from the tools module, as the README uses it.
		{&grpcurlBin, "github.com/fullstorydev/grpcurl/cmd/grpcurl", "tools/go.mod"},
		// The node agent's container init, for the Kubernetes tests.
		{&containerInitBin, "stoke.dev/stoke/internal/kubetest/nodeagent/containerinit/cmd/stoke-container-init", ""},
	} {
		path, cleanup, err := testbin.Build(b.pkg, b.modfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			exit(1)
		}
		*b.path = path
		cleanups = append(cleanups, cleanup)
	}
	// Beside stoke, where a lambda Runtime Server finds the bootstrap it
	// packages (as make build and the Dockerfile place it).
	if _, err := testbin.LambdaBootstrap(filepath.Dir(stokeBin)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		exit(1)
	}
	exit(m.Run())
}
