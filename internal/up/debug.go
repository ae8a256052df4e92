package up

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"stoke.dev/stoke/internal/datadir"
	"stoke.dev/stoke/internal/debugsock"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/pool"
)

// UpProcess names stoke up itself among the processes whose debug
// sockets DebugSockets lists; every other is a pod, by its name.
const UpProcess = "up"

// probeTimeout bounds the dial that tells a live socket from a stale one:
// a live process accepts at once (the kernel queues the connection), a
// stale file refuses at once; only a stopped process with a full backlog
// waits it out.
const probeTimeout = time.Second

// DebugSocket is one process of a stoke up that serves Go's profiles.
type DebugSocket struct {
	Process string // UpProcess, or the pod's name
	Path    string
	// Live is whether a process accepted a connection on Path. A socket
	// file whose process was killed with SIGKILL stays behind, stale,
	// until the next stoke up on the data directory replaces it.
	Live bool
}

// State is "live" or "stale", as `stoke debug sockets` shows it.
func (s DebugSocket) State() string {
	if s.Live {
		return "live"
	}
	return "stale"
}

// DebugSockets lists the debug socket files on the data directory
// dataDir: stoke up's at its default path (datadir.DebugSocket) first,
// then its pods', by name, each dialled (within probeTimeout) to tell
// whether its process still serves it.
func DebugSockets(ctx context.Context, dataDir string) ([]DebugSocket, error) {
	var out []DebugSocket
	if p := datadir.DebugSocket(dataDir); debugsock.IsSocket(p) {
		out = append(out, DebugSocket{Process: UpProcess, Path: p})
	}
	pods, err := pool.PodDebugSockets(dataDir)
	if err != nil {
		return nil, err
	}
	for _, name := range slices.Sorted(maps.Keys(pods)) {
		out = append(out, DebugSocket{Process: name, Path: pods[name]})
	}
	for i := range out {
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		out[i].Live = debugsock.Probe(pctx, out[i].Path) == nil
		cancel()
	}
	return out, nil
}

// podSuffix is what the pool supervisor appends to a Runtime's name to
// name a pod.
var podSuffix = regexp.MustCompile(`^-[a-z0-9]{5}$`)

// RunPod resolves a Run's name to the pod it is on (its
// status.assignedPod); errdefs.ErrNotFound when there is no such Run.
type RunPod func(ctx context.Context, run string) (string, error)

// FindDebugSocket is the live debug socket of process on dataDir, tried
// in this order: UpProcess (or empty) for stoke up, a pod's name, a
// Runtime's name when it has exactly one live pod, then (when runPod is
// not nil) a Run's name, for the pod it is on. A socket whose process is
// gone is refused, saying so; any other error says which processes there
// are.
func FindDebugSocket(ctx context.Context, dataDir, process string, runPod RunPod) (string, error) {
	if process == "" {
		process = UpProcess
	}
	socks, err := DebugSockets(ctx, dataDir)
	if err != nil {
		return "", err
	}
	var names, live, stale []string
	byName := map[string]DebugSocket{}
	for _, s := range socks {
		names = append(names, s.Process+" ("+s.State()+")")
		byName[s.Process] = s
		if rest, ok := strings.CutPrefix(s.Process, process); ok && podSuffix.MatchString(rest) {
			if s.Live {
				live = append(live, s.Process)
			} else {
				stale = append(stale, s.Process)
			}
		}
	}
	if s, ok := byName[process]; ok {
		return liveSocket(s)
	}
	switch {
	case len(live) == 1:
		return byName[live[0]].Path, nil
	case len(live) > 1:
		return "", fmt.Errorf("runtime %s has %d live pods with a debug socket (%s): name one", process, len(live), strings.Join(live, ", "))
	case process == UpProcess && len(names) == 0:
		return "", fmt.Errorf("no debug socket in %s: is stoke up serving it (with its default --debug-socket)?", dataDir)
	case process == UpProcess:
		return "", fmt.Errorf("stoke up serves no debug socket at %s (it was started with another --debug-socket: pass --socket); there are: %s", datadir.DebugSocket(dataDir), strings.Join(names, ", "))
	}
	there := "there are none"
	if len(names) > 0 {
		there = "there are: " + strings.Join(names, ", ")
	}
	if runPod != nil {
		pod, err := runPod(ctx, process)
		switch {
		case err == nil:
			s, ok := byName[pod]
			if !ok {
				return "", fmt.Errorf("run %s is on pod %s, which has no debug socket in %s; %s", process, pod, dataDir, there)
			}
			return liveSocket(s)
		case !errors.Is(err, errdefs.ErrNotFound):
			return "", fmt.Errorf("no process %q with a debug socket in %s (%s); looking for a Run %q: %w", process, dataDir, there, process, err)
		}
	}
	if len(stale) > 0 {
		return "", fmt.Errorf("runtime %s has no live pod: %s gone (their debug sockets are stale)", process, strings.Join(stale, ", "))
	}
	what := "process"
	if runPod != nil {
		what = "process or Run"
	}
	return "", fmt.Errorf("no %s %q with a debug socket in %s; %s", what, process, dataDir, there)
}

// liveSocket is s's path, or an error saying its process is gone.
func liveSocket(s DebugSocket) (string, error) {
	if s.Live {
		return s.Path, nil
	}
	who := "pod " + s.Process
	if s.Process == UpProcess {
		who = "stoke up"
	}
	return "", fmt.Errorf("%s is gone: its debug socket %s is stale (refuses connections), left by a process that was killed (SIGKILL) before it could remove it", who, s.Path)
}
