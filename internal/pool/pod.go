// Package pool supervises runtime pods in standalone mode: for each Runtime
// object it keeps spec.replicas pods running, each a `stoke runtime-server`
// child process with its own name and UID, health-checks them, fences and
// replaces (under a new UID) a pod that dies or stops answering, and tells
// subscribers — the scheduler, the reaper and the runtimed wiring — when a
// pod becomes ready or is gone.
//
// A pod named <runtime>-<5 random letters and digits> lives in
// <data>/pods/<name>/: its Runtime Server listens on rs.sock there, keeps
// its private state in state/, and the supervisor records in sid the
// session the server leads. All pods share one workspace root,
// <data>/runs, where runtimed puts each Run's working directory. Each
// Runtime Server is started through internal/proc in a session of its
// own, with SIGTERM as its parent-death signal; its output is logged line
// by line, bounded, with the pod's name and UID.
//
// A pod is ready once its grpc.health.v1 check of executor.v1.Runtime
// answers SERVING (within Config.StartTimeout, or it is killed and
// replaced). It is then checked every HealthInterval; UnhealthyAfter
// failures in a row fence it. A pod that exits, is fenced, or fails to
// start is replaced under a new name and UID, after a backoff that doubles
// from 100 ms up to 10 s while its pool's pods keep failing.
//
// Fencing: PodGone is sent only after the pod's processes are dead. When
// a pod ends for any reason (its server exited or was killed, turned
// unhealthy, or was stopped), every process of its session is killed —
// everything the Runtime Server started stays in that session, in process
// groups of its own and as an orphan too — and the supervisor waits until
// none is left. A pod that is stopped on purpose (scale down, Runtime
// deleted, shutdown) is first sent SIGTERM so that its Runtime Server
// drains for its --shutdown-grace.
//
// If the supervisor's process dies, each Runtime Server gets SIGTERM from
// the kernel and drains as above. A supervisor started later on the same
// data directory kills what is left of the sessions recorded in the old
// pod directories (and logs it) before it clears them.
//
// Status: the supervisor writes status.readyPods and status.pods of each
// Runtime (with optimistic-concurrency retries, from its own goroutine)
// when a pod starts, becomes ready or goes away, and every
// Config.StatusInterval to refresh lastHeartbeat — never per health check.
// A pod being stopped is shown not ready at once, though it stays in Pods
// and Lookup until its PodGone.
package pool

import "stoke.dev/stoke/api/stoke/v1alpha1"

// Pod is one runtime pod as the control plane sees it. A pod that is
// replaced gets a new UID, so a Run assigned to the old UID is fenced.
type Pod struct {
	// Namespace and Runtime name the Runtime object that owns the pod.
	Namespace string
	Runtime   string
	Name      string
	UID       string
	// Server is the built-in Runtime Server: "bash", "python" or "lambda".
	Server string
	// Lambda is the Runtime's spec.lambda, for the lambda server's flags.
	Lambda *v1alpha1.LambdaSpec
	// Slots is the Runtime's spec.runs: how many Runs the pod may hold.
	Slots int32
	// Addr is the Runtime Server's gRPC target, e.g.
	// "unix:///data/pods/bash-x7k2p/rs.sock".
	Addr string
	// WorkspaceRoot is where working directories of this pod's Runs live;
	// the Runtime Server refuses any working_dir outside it.
	WorkspaceRoot string
}

// EventType says what happened to a pod.
type EventType string

const (
	// PodReady: the pod's Runtime Server answers health checks.
	PodReady EventType = "Ready"
	// PodGone: the pod died or was fenced; its process group is killed
	// before this event is sent, so nothing it runs can still act.
	PodGone EventType = "Gone"
)

// Reasons a PodGone carries.
const (
	// ReasonExited: the Runtime Server exited (or was killed) on its own.
	ReasonExited = "Exited"
	// ReasonUnhealthy: UnhealthyAfter health checks in a row failed, so the
	// supervisor fenced the pod.
	ReasonUnhealthy = "Unhealthy"
	// ReasonScaledDown: spec.replicas was lowered.
	ReasonScaledDown = "ScaledDown"
	// ReasonRuntimeDeleted: the Runtime was deleted (or is being deleted,
	// or was replaced by a new object of the same name).
	ReasonRuntimeDeleted = "RuntimeDeleted"
	// ReasonServerChanged: spec.server changed in place. Validation forbids
	// it; the supervisor still replaces the pods rather than serve the old
	// server under the new name.
	ReasonServerChanged = "ServerChanged"
	// ReasonShutdown: the supervisor is stopping.
	ReasonShutdown = "Shutdown"
)

// Event is one pod transition.
//
// Every pod announced with PodReady is later announced exactly once with
// PodGone, and only after its processes are dead. PodReady may come again
// for the same UID with a changed Slots (spec.runs changed); a subscriber
// treats it as an update. A pod that dies before it was ever ready is never
// announced at all.
type Event struct {
	Type   EventType
	Pod    Pod
	Reason string // for PodGone: one of the Reason constants; empty for PodReady
}

// Source is the supervisor as its consumers (the scheduler, the reaper,
// the runtimed wiring) see it: Subscribe returns the pods ready now and a
// channel of later events (PodReady, PodGone); cancel ends the
// subscription. Tests feed pod events through their own Source.
type Source interface {
	Subscribe() (events <-chan Event, snapshot []Pod, cancel func())
}
