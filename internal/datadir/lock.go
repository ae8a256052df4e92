package datadir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"stoke.dev/stoke/internal/errdefs"
)

// lockFile, in the data directory, is held (flock) by the `stoke up` that
// serves it and names that process's pid.
const lockFile = "lock"

// Lock takes the data directory dir for this process: an exclusive flock
// on dir/lock, which then holds this process's pid. The kernel drops the
// lock when the process dies, so a crash never leaves dir locked. When
// another process holds it, the error names that process's pid, so that a
// second `stoke up` says who serves the directory instead of failing later
// on a port in use. release unlocks.
func Lock(dir string) (release func(), err error) {
	path := filepath.Join(dir, lockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("locking the data directory: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("locking the data directory %s: %w", dir, err)
		}
		who := "another stoke up"
		if b, rerr := os.ReadFile(path); rerr == nil {
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil && pid > 0 {
				who = fmt.Sprintf("another stoke up (pid %d)", pid)
			}
		}
		return nil, errdefs.Errorf(errdefs.ErrUnavailable, "%s serves this data directory (%s); stop it first, or pass another --data-dir", who, dir)
	}
	// The pid goes in only once the lock is held: a reader that finds the
	// file locked but still empty names no pid rather than a stale one.
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("recording this process in the data directory's lock: %w", err)
	}
	return func() { _ = f.Close() }, nil
}
