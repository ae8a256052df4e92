package up

import (
	"fmt"
	"io/fs"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"

	"stoke.dev/stoke/internal/datadir"
	"stoke.dev/stoke/internal/pool"
)

// UpProcess names stoke up itself among the processes whose debug
// sockets DebugSockets lists; every other is a pod, by its name.
const UpProcess = "up"

// DebugSocket is one process of a stoke up that serves Go's profiles.
type DebugSocket struct {
	Process string // UpProcess, or the pod's name
	Path    string
}

// DebugSockets lists the debug sockets serving on the data directory
// dataDir: stoke up's at its default path (datadir.DebugSocket) first,
// then its pods', by name. A socket file is listed while it exists: from
// its process's start to its end.
func DebugSockets(dataDir string) ([]DebugSocket, error) {
	var out []DebugSocket
	if p := datadir.DebugSocket(dataDir); isSocket(p) {
		out = append(out, DebugSocket{Process: UpProcess, Path: p})
	}
	pods, err := pool.PodDebugSockets(dataDir)
	if err != nil {
		return nil, err
	}
	for _, name := range slices.Sorted(maps.Keys(pods)) {
		out = append(out, DebugSocket{Process: name, Path: pods[name]})
	}
	return out, nil
}

// podSuffix is what the pool supervisor appends to a Runtime's name to
// name a pod.
var podSuffix = regexp.MustCompile(`^-[a-z0-9]{5}$`)

// FindDebugSocket is the debug socket of process on dataDir: UpProcess
// (or empty) for stoke up, a pod's name, or a Runtime's name when it has
// exactly one pod. The error says which processes there are.
func FindDebugSocket(dataDir, process string) (string, error) {
	if process == "" {
		process = UpProcess
	}
	socks, err := DebugSockets(dataDir)
	if err != nil {
		return "", err
	}
	var names, matches []string
	byName := map[string]string{}
	for _, s := range socks {
		names = append(names, s.Process)
		byName[s.Process] = s.Path
		if rest, ok := strings.CutPrefix(s.Process, process); ok && podSuffix.MatchString(rest) {
			matches = append(matches, s.Process)
		}
	}
	if p, ok := byName[process]; ok {
		return p, nil
	}
	switch {
	case len(matches) == 1:
		return byName[matches[0]], nil
	case len(matches) > 1:
		return "", fmt.Errorf("runtime %s has %d pods with a debug socket (%s): name one", process, len(matches), strings.Join(matches, ", "))
	case len(names) == 0:
		return "", fmt.Errorf("no debug socket in %s: is stoke up serving it (with its default --debug-socket)?", dataDir)
	case process == UpProcess:
		return "", fmt.Errorf("stoke up serves no debug socket at %s (it was started with another --debug-socket: pass --socket); there are: %s", datadir.DebugSocket(dataDir), strings.Join(names, ", "))
	}
	return "", fmt.Errorf("no process %q with a debug socket in %s; there are: %s", process, dataDir, strings.Join(names, ", "))
}

func isSocket(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.Mode().Type() == fs.ModeSocket
}
