// Package pool supervises runtime pods in standalone mode: for each Runtime
// object it keeps spec.replicas pods running, each a `stoke runtime-server`
// child process with its own name and UID, health-checks them, fences and
// replaces (under a new UID) a pod that dies or stops answering, and tells
// subscribers — the scheduler, the reaper and the runtimed wiring — when a
// pod becomes ready or is gone: it is a Source, publishing
// through a podsource.Hub.
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
