package testbin

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"
)

// PythonSparesIdle reports whether every Python Runtime Server among the
// descendants of root (a `stoke ... runtime-server --runtime python`
// process: standalone's pods, or the test cluster's runtime Pods) has a
// spare worker idle on its request pipe, as a pod whose Functions have
// been at zero a while has (internal/runtime/python's spare.go). A spare
// is a worker started with an empty handler argument in "/"; idle is its
// one thread asleep in a pipe read, which it reaches once its start-up is
// done. False when there is no such server. Benchmarks that time a scale
// from zero poll it before the timed part: nothing tells the outside that
// a spare is ready.
func PythonSparesIdle(root int) bool {
	parent, err := ReadProcTree()
	if err != nil {
		return false
	}
	servers, idle := map[int]bool{}, map[int]bool{}
	for pid, ppid := range parent {
		if !parent.Under(pid, root) {
			continue
		}
		dir := filepath.Join("/proc", strconv.Itoa(pid))
		raw, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil {
			continue
		}
		args := bytes.Split(raw, []byte{0})
		switch {
		case len(args) > 3 && string(args[1]) == "runtime-server" && pythonServer(args):
			servers[pid] = true
		case idleSpare(dir, args):
			idle[ppid] = true
		}
	}
	if len(servers) == 0 {
		return false
	}
	for s := range servers {
		if !idle[s] {
			return false
		}
	}
	return true
}

// idleSpare reports whether the process of /proc directory dir, whose
// arguments are args, is a spare Python worker idle on its request pipe.
func idleSpare(dir string, args [][]byte) bool {
	if len(args) <= 4 || string(args[1]) != "-s" || string(args[2]) != "-c" || len(args[4]) != 0 {
		return false
	}
	cwd, _ := os.Readlink(filepath.Join(dir, "cwd"))
	wchan, _ := os.ReadFile(filepath.Join(dir, "wchan"))
	return cwd == "/" && (bytes.Contains(wchan, []byte("pipe_read")) || bytes.Contains(wchan, []byte("pipe_wait")))
}

// PythonSpareIdle reports whether process pid, which runs a python
// Runtime Server in-process (a test calling server.Run), has a spare
// worker idle among its children, as PythonSparesIdle judges one.
func PythonSpareIdle(pid int) bool {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		dir := filepath.Join("/proc", e.Name())
		st, err := os.ReadFile(filepath.Join(dir, "stat"))
		if err != nil {
			continue
		}
		f := bytes.Fields(st[bytes.LastIndexByte(st, ')')+1:])
		if len(f) < 2 || string(f[1]) != strconv.Itoa(pid) {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err == nil && idleSpare(dir, bytes.Split(raw, []byte{0})) {
			return true
		}
	}
	return false
}

// AwaitPythonSpareIdle polls PythonSpareIdle(pid) until it holds or bound
// passes, and returns how long that took.
func AwaitPythonSpareIdle(pid int, bound time.Duration) (time.Duration, error) {
	start := time.Now()
	for !PythonSpareIdle(pid) {
		if time.Since(start) > bound {
			return time.Since(start), fmt.Errorf("no spare python worker was idle within %s", bound)
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(start), nil
}

// AwaitPythonSparesIdle polls PythonSparesIdle(root) until it holds or
// bound passes, and returns how long that took. Polled: nothing tells
// the outside that a spare is ready.
func AwaitPythonSparesIdle(root int, bound time.Duration) (time.Duration, error) {
	start := time.Now()
	for !PythonSparesIdle(root) {
		if time.Since(start) > bound {
			return time.Since(start), fmt.Errorf("the Python Runtime Servers' spare workers were not all idle within %s", bound)
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(start), nil
}

// pythonServer reports whether a runtime-server's arguments say
// `--runtime python`.
func pythonServer(args [][]byte) bool {
	i := slices.IndexFunc(args, func(a []byte) bool { return string(a) == "--runtime" })
	return i >= 0 && i+1 < len(args) && string(args[i+1]) == "python"
}
