// Package selfcopy copies the running stoke executable to a path. It is
// how a runtime Pod whose runtime-server container runs a user's image
// gets Stoke's binary: an init container of Stoke's own image runs
// `stoke install-binary` into an emptyDir that the runtime-server
// container mounts (internal/runtimeset), so the user's image needs no
// Stoke in it.
package selfcopy

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// To copies the running executable to dest, executable by everyone
// (0755), through a temporary file in dest's directory renamed into
// place, so that dest is never seen half written.
func To(dest string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("install binary: find this executable: %w", err)
	}
	return copyFile(self, dest)
}

func copyFile(src, dest string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("install binary: %w", err)
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dest), "."+filepath.Base(dest)+"-*")
	if err != nil {
		return fmt.Errorf("install binary: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err = io.Copy(tmp, in); err != nil {
		tmp.Close()
		return fmt.Errorf("install binary: copy %s to %s: %w", src, tmp.Name(), err)
	}
	if err = tmp.Chmod(0o755); err == nil {
		err = tmp.Close()
	} else {
		tmp.Close()
	}
	if err != nil {
		return fmt.Errorf("install binary: %w", err)
	}
	if err = os.Rename(tmp.Name(), dest); err != nil {
		return fmt.Errorf("install binary: %w", err)
	}
	return nil
}
