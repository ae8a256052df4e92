package exec

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"stoke.dev/stoke/internal/bounds"
)

// A session's pipe holds a whole frame.
func TestGrowPipe(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	growPipe(w)
	rc, err := r.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var size int
	if err := rc.Control(func(fd uintptr) { size, err = unix.FcntlInt(fd, unix.F_GETPIPE_SZ, 0) }); err != nil {
		t.Fatal(err)
	}
	if err != nil || size < bounds.ExecFrame {
		t.Fatalf("pipe holds %d bytes (%v), want %d", size, err, bounds.ExecFrame)
	}
}
