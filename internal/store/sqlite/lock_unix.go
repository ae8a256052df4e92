//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package sqlite

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"stoke.dev/stoke/internal/errdefs"
)

// lockDir takes an exclusive, non-blocking flock on dir/stoke.db.lock. The
// in-process write mutex and the in-memory watch fan-out are only correct
// with one process writing; the kernel drops the lock when the process
// dies, so a crash never leaves the directory locked.
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, FileName+".lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open store lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("store %s is in use by another process: %w", dir, errdefs.ErrUnavailable)
		}
		return nil, fmt.Errorf("lock store %s: %w", dir, err)
	}
	return f, nil
}
