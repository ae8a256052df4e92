// Package containerinit is the node agent's container init: the first
// process of each container, started by the agent in new mount, PID and
// UTS namespaces. It builds the container's view of the file system (the
// host's directories, a fresh /proc and the Pod's volumes bind-mounted at
// their mountPaths, with any missing mount point created on tmpfs rather
// than on the host), pivots into it, starts the container's command as its
// child and stays PID 1: it forwards signals to the command, reaps
// orphans, runs exec requests (probes, Agent.Exec) in the container's
// namespaces and environment, and exits with the command's status, which
// makes the kernel kill whatever is left in the container.
//
// The agent and the init share this package: Spec and the exec protocol.
package containerinit

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"time"
)

// Spec is what the agent tells the init, as JSON on file descriptor 3.
// It carries the container's environment, so it never travels in argv.
type Spec struct {
	// Hostname is set in the container's UTS namespace (the Pod's name).
	Hostname string `json:"hostname"`
	// Root is an empty directory, owned by the agent, where the init
	// builds the container's root.
	Root string `json:"root"`
	// Mounts are bound in order; the agent sorts them so that a parent's
	// mount comes before one inside it.
	Mounts []Mount `json:"mounts"`
	// Argv is the command; a first word without a slash is looked up in
	// Env's PATH inside the container.
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	// Dir is the working directory inside the container ("/" if empty).
	Dir string `json:"dir"`
	// ExecSocket is the Unix socket (in a 0700 directory of the agent's)
	// where the init takes exec requests.
	ExecSocket string `json:"execSocket"`
}

// Mount binds the host path Source at Target inside the container.
type Mount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly"`
}

// maxRequest bounds an exec request; maxOutput bounds the output an exec
// returns (a probe's output is only for its failure message), the rest is
// drained and dropped as the kubelet does (it keeps 10 KiB).
const (
	maxRequest = 64 << 10
	maxOutput  = 10 << 10
)

// ExecRequest asks the init to run Argv in the container.
type ExecRequest struct {
	Argv    []string      `json:"argv"`
	Timeout time.Duration `json:"timeout"`
}

// ExecResult is how the command ended. ExitCode is 128+signal for a
// signalled command; Error is set when it could not start or timed out.
type ExecResult struct {
	ExitCode int    `json:"exitCode"`
	Output   string `json:"output"`
	Error    string `json:"error,omitempty"`
	TimedOut bool   `json:"timedOut,omitempty"`
}

// Exec runs req in the container whose init listens on socket.
func Exec(ctx context.Context, socket string, req ExecRequest) (ExecResult, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return ExecResult{}, fmt.Errorf("exec %q: %w", req.Argv, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return ExecResult{}, fmt.Errorf("exec %q: send: %w", req.Argv, err)
	}
	var res ExecResult
	if err := json.NewDecoder(bufio.NewReader(conn)).Decode(&res); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return ExecResult{}, fmt.Errorf("exec %q: receive: %w", req.Argv, err)
	}
	return res, nil
}
