package runtime

import (
	"errors"
	"io/fs"
	"os"
	"syscall"
)

// MakeDir creates dir with mode 0700. Its parent normally exists, so this is
// one mkdir; missing parents are created as MkdirAll would. An existing dir
// is an error (fs.ErrExist).
func MakeDir(dir string) error {
	err := os.Mkdir(dir, 0o700)
	if errors.Is(err, fs.ErrNotExist) {
		return os.MkdirAll(dir, 0o700)
	}
	return err
}

// RemoveDir removes dir and what it holds, as os.RemoveAll does, but an
// empty or missing directory costs one rmdir rather than RemoveAll's
// unlink, rmdir and walk: most working and scratch directories are left
// empty.
func RemoveDir(dir string) error {
	err := syscall.Rmdir(dir)
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return os.RemoveAll(dir)
}
