package up

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// StopWithGoRun makes this process stop (SIGTERM, the clean stop) when its
// parent dies, if that parent is the go command: under `go run`, the pid a
// user sees and signals is go's, and go exits on SIGTERM without passing
// it on, which would leave the server running under init. Under any other
// parent (a shell, a service manager) it does nothing, so that `stoke up &`
// in a script outlives the script as a started program should.
func StopWithGoRun() error {
	ppid := os.Getppid()
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", ppid))
	if err != nil || filepath.Base(exe) != "go" {
		return nil
	}
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGTERM), 0, 0, 0); err != nil {
		return fmt.Errorf("parent-death signal: %w", err)
	}
	// go may have died before the prctl: then no signal will come.
	if os.Getppid() != ppid {
		return syscall.Kill(os.Getpid(), syscall.SIGTERM)
	}
	return nil
}
