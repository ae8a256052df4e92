package lambda_test

import (
	"os"
	"path/filepath"
	"testing"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/lambda"
)

// TestThePackagedBootstrapLeavesRoom takes the stoke-lambda-bootstrap
// TestMain built as make build does, beside the test's stoke, and the
// package a Runtime Server told nothing makes of a small task: it holds
// that bootstrap, not the stoke binary (which deflates to about Lambda's
// 50 MiB direct-upload limit), and stays under half the limit, so that a
// Run's own source has room.
func TestThePackagedBootstrapLeavesRoom(t *testing.T) {
	boot, stoke := bootstrapBin, stokeBin
	if got := lambda.DefaultBootstrap(stoke); got != boot {
		t.Fatalf("DefaultBootstrap(%s) = %s, want the bootstrap beside it, %s", stoke, got, boot)
	}
	fi, err := os.Stat(boot)
	if err != nil {
		t.Fatal(err)
	}
	srv := newServerWith(t, simulator(t), "python", func(c *lambda.Config) { c.Bootstrap = lambda.DefaultBootstrap(stoke) })
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "task.sh"), []byte("echo hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	zipped, packaged, err := srv.PackageSize(src)
	if err != nil {
		t.Fatal(err)
	}
	if packaged != uint64(fi.Size()) {
		t.Errorf("the package's bootstrap is %d bytes, want stoke-lambda-bootstrap's %d", packaged, fi.Size())
	}
	t.Logf("stoke-lambda-bootstrap: %d bytes, %d zipped with a task; Lambda's limit %d", fi.Size(), zipped, bounds.LambdaZip)
	if zipped > bounds.LambdaZip/2 {
		t.Errorf("the package is %d bytes zipped, more than half of Lambda's %d-byte limit (bounds.LambdaZip)", zipped, bounds.LambdaZip)
	}
}

// TestDefaultBootstrapFallsBackToStoke: with no stoke-lambda-bootstrap
// beside it, the stoke binary itself is the bootstrap (it takes that role
// under the name bootstrap).
func TestDefaultBootstrapFallsBackToStoke(t *testing.T) {
	stoke := filepath.Join(t.TempDir(), "stoke")
	if got := lambda.DefaultBootstrap(stoke); got != stoke {
		t.Fatalf("DefaultBootstrap(%s) = %s, want stoke itself", stoke, got)
	}
}
