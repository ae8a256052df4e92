// Package podsource is the pool of runtime pods as the control plane sees
// it, whatever runs them: a Pod, the events that say it became ready or is
// gone, and Source, which the scheduler, the reaper and the runtimed wiring
// subscribe to. Standalone's supervisor of local child processes
// (internal/pool) and the Kubernetes Pods and Leases of `stoke controller`
// (internal/kubepods) are the two sources; both publish through a Hub,
// which keeps the ready set and every subscriber's queue.
package podsource

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
	// Template is the Runtime's spec.template: in standalone, the env
	// its pods' handlers get.
	Template *v1alpha1.RuntimeTemplate
	// Slots is the Runtime's spec.runs: how many Runs the pod may hold.
	// Zero: the pod is alive but takes no new Runs for now (in
	// Kubernetes, a Pod that is not Ready yet or for the moment); the Runs
	// it holds stay with it.
	Slots int32
	// Addr is where the pod is reached: in standalone the Runtime Server's
	// gRPC target, e.g. "unix:///data/pods/bash-x7k2p/rs.sock"; in
	// Kubernetes runtimed's hop, "<pod IP>:7443".
	Addr string
	// WorkspaceRoot is where working directories of this pod's Runs live;
	// the Runtime Server refuses any working_dir outside it.
	WorkspaceRoot string
}

// EventType says what happened to a pod.
type EventType string

const (
	// PodReady: the pod can take Runs (standalone: its Runtime Server
	// answers health checks; Kubernetes: the Pod is Ready and its runtimed
	// renews its Lease).
	PodReady EventType = "Ready"
	// PodGone: the pod died or was fenced. A source sends it only once
	// nothing the pod runs can still act on a Run assigned to it (see
	// Event).
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
	// ReasonTemplateChanged: spec.template changed (standalone: its env);
	// the pods are replaced, as a Deployment rolls its Pods.
	ReasonTemplateChanged = "TemplateChanged"
	// ReasonShutdown: the source is stopping.
	ReasonShutdown = "Shutdown"
	// ReasonPodDeleted: the Kubernetes Pod was deleted (or is being
	// deleted).
	ReasonPodDeleted = "PodDeleted"
	// ReasonNotReady: the Kubernetes Pod stayed NotReady past the grace.
	ReasonNotReady = "NotReady"
	// ReasonLeaseExpired: the Pod's runtimed stopped renewing its Lease.
	ReasonLeaseExpired = "LeaseExpired"
)

// Event is one pod transition.
//
// Every pod announced with PodReady is later announced exactly once with
// PodGone, unless the source stops first (its subscriptions then end). In standalone PodGone comes only after the pod's processes are
// dead; in Kubernetes once the Pod is deleted, has stayed NotReady past a
// grace, or its runtimed's Lease has expired (runtimed stops acting on its
// Runs when it cannot renew the Lease). PodReady may come again for the
// same UID with a changed Slots (spec.runs changed); a subscriber treats it
// as an update. A pod that dies before it was ever ready is never
// announced at all.
type Event struct {
	Type   EventType
	Pod    Pod
	Reason string // for PodGone: one of the Reason constants; empty for PodReady
}

// Source is a pool of pods as its consumers (the scheduler, the reaper,
// the runtimed wiring) see it: Subscribe returns the pods ready now and a
// channel of later events (PodReady, PodGone); cancel ends the
// subscription. Tests feed pod events through their own Source (a Hub).
type Source interface {
	Subscribe() (events <-chan Event, snapshot []Pod, cancel func())
}
