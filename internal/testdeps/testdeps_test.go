package testdeps

import (
	"os/exec"
	"strings"
	"testing"
)

func TestPathBuildsARunnableProgram(t *testing.T) {
	p, err := Path("aws-lambda-rie")
	if err != nil {
		t.Fatal(err)
	}
	again, err := Path("aws-lambda-rie")
	if err != nil || again != p {
		t.Fatalf("second Path = %q, %v; want %q", again, err, p)
	}
	// The RIE checks its listen address before it does anything else.
	out, err := exec.Command(p, "--runtime-interface-emulator-address", "not-an-address").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not a valid network address") {
		t.Fatalf("%s --help printed %q", p, out)
	}
}

func TestPathRejectsAnUnknownName(t *testing.T) {
	if _, err := Path("no-such-tool"); err == nil || !strings.Contains(err.Error(), "aws-lambda-rie") {
		t.Fatalf("Path(no-such-tool) = %v; want an error listing the known programs", err)
	}
}
