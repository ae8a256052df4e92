package pool

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
)

// claimPodDir picks a free pod name for runtime and creates its directory.
func (s *Supervisor) claimPodDir(runtime string) (name, dir string, err error) {
	for range 10 {
		name = runtime + "-" + randomSuffix()
		dir = filepath.Join(s.podsDir, name)
		// The longer of the pod's two socket names.
		if sock := filepath.Join(dir, DebugSocketName); len(sock) > maxSocketPath {
			return "", "", fmt.Errorf("socket path %s is longer than %d bytes: use a shorter data directory", sock, maxSocketPath)
		}
		err = os.Mkdir(dir, 0o700)
		if err == nil {
			return name, dir, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", "", fmt.Errorf("pod directory: %w", err)
		}
	}
	return "", "", fmt.Errorf("no free pod name for %s", runtime)
}

// randomSuffix is 5 random lowercase letters and digits, like a
// Kubernetes generateName suffix.
func randomSuffix() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 5)
	for i := range b {
		b[i] = alphabet[rand.IntN(len(alphabet))]
	}
	return string(b)
}
