package pool

import (
	"log/slog"
	"time"

	"stoke.dev/stoke/internal/proc"
)

// fenceWait bounds how long fence waits for killed processes to be gone.
const fenceWait = 5 * time.Second

// fence makes sure nothing of a pod runs any more, and returns once that is
// so (or after fenceWait, with a warning).
//
// The Runtime Server leads a session of its own, and everything it starts
// stays in that session: the process groups it gives user code (tasks,
// warm shells, Python workers), the groups those make with job control,
// and their orphans, which the kernel reparents away from the pod. So
// fence kills the session, which reaches all of it whether the server
// still runs, is stopped, or has already exited (the session outlives its
// leader). Only a process that calls setsid itself escapes. Then it waits
// for the server to be reaped. (It does not signal the server's group
// after a successful session kill: once the session is empty, the group's
// number may already belong to another process.)
func fence(p *proc.Process, log *slog.Logger) {
	killed, err := proc.KillSession(p.Pid(), fenceWait)
	if err != nil {
		log.Warn("processes of a killed pod are still running", "err", err)
		p.Kill(0) // the server at least; returns once it is reaped
	}
	<-p.Done()
	// The server itself is in killed when it still ran; anything else
	// means the pod had left processes behind.
	if len(killed) > 1 || (len(killed) == 1 && killed[0] != p.Pid()) {
		log.Info("killed the pod's processes", "pids", killed)
	}
}
