package pool

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"stoke.dev/stoke/internal/debugsock"
)

// PodDebugSockets lists the debug sockets of the pods that a supervisor
// on dataDir runs (Config.DebugSockets), by pod name: each pod directory
// under <dataDir>/pods that holds one. A data directory without pods
// gives none.
func PodDebugSockets(dataDir string) (map[string]string, error) {
	podsDir := filepath.Join(dataDir, "pods")
	entries, err := os.ReadDir(podsDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing the pods' debug sockets: %w", err)
	}
	out := map[string]string{}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		sock := filepath.Join(podsDir, e.Name(), DebugSocketName)
		if debugsock.IsSocket(sock) {
			out[e.Name()] = sock
		}
	}
	return out, nil
}
