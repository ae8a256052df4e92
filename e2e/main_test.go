package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Binaries built once for every test in the package.
var stokeBin, grpcurlBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "stoke-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	stokeBin = filepath.Join(dir, "stoke")
	grpcurlBin = filepath.Join(dir, "grpcurl")
	builds := [][]string{
		{"go", "build", "-o", stokeBin, "stoke.dev/stoke/cmd/stoke"},
		// The pinned grpcurl from the tools module, as the README uses it.
		{"go", "build", "-modfile=tools/go.mod", "-o", grpcurlBin, "github.com/fullstorydev/grpcurl/cmd/grpcurl"},
	}
	for _, b := range builds {
		cmd := exec.Command(b[0], b[1:]...)
		cmd.Dir = ".."
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "building %v: %v\n", b, err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
