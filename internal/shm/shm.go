// Package shm places small, short-lived files that processes exchange
// (request files and FIFOs) on a memory file system when there is one:
// creating and removing a file on a journalled disk file system costs each
// warm Bash invocation tens of microseconds more than on tmpfs.
package shm

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Root is where Linux mounts its shared-memory tmpfs.
const Root = "/dev/shm"

// Usable reports whether Root is a tmpfs this process can create files in.
func Usable() bool {
	var st unix.Statfs_t
	if err := unix.Statfs(Root, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		return false
	}
	return unix.Access(Root, unix.W_OK|unix.X_OK) == nil
}

// MkdirTemp creates a new private directory (mode 0700) named after
// pattern as os.MkdirTemp does: in Root when it is Usable, otherwise in
// fallback (os.TempDir when empty).
func MkdirTemp(fallback, pattern string) (string, error) {
	if Usable() {
		if dir, err := os.MkdirTemp(Root, pattern); err == nil {
			return dir, nil
		}
	}
	return os.MkdirTemp(fallback, pattern)
}

// MkdirRecorded creates a new private directory (mode 0700) named prefix
// and a random suffix in Root, for a directory a later process may have to
// remove when this one dies (RemoveRecorded): record is given its path
// before it is made, so that no crash leaves a directory nobody knows of.
// When Root is not Usable it is made in fallback instead and not recorded:
// fallback is expected to be removed with its parent.
func MkdirRecorded(fallback, prefix string, record func(dir string) error) (string, error) {
	if !Usable() {
		return os.MkdirTemp(fallback, prefix)
	}
	for range 10 {
		var b [8]byte
		_, _ = rand.Read(b[:]) // never fails on Linux
		dir := filepath.Join(Root, prefix+hex.EncodeToString(b[:]))
		if err := record(dir); err != nil {
			return "", err
		}
		err := os.Mkdir(dir, 0o700)
		if err == nil {
			return dir, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return "", err
		}
	}
	return "", fmt.Errorf("shm: no free name for %s in %s", prefix, Root)
}

// RemoveRecorded removes a directory that MkdirRecorded made for an earlier
// process and that process recorded: only a directory directly in Root
// whose name starts with prefix, owned by this user, so that a corrupt or
// forged record cannot remove anything else.
func RemoveRecorded(dir, prefix string) error {
	if filepath.Dir(dir) != Root || !strings.HasPrefix(filepath.Base(dir), prefix) {
		return fmt.Errorf("shm: %q is not a directory this package made", dir)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("shm: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != os.Getuid() {
		return fmt.Errorf("shm: %q is not a directory of this user", dir)
	}
	return os.RemoveAll(dir)
}
