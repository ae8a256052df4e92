package runtimed

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// The marks of taken Runs: the fence of a deferred claim (deferClaim) for
// a task in a shared workspace. A task of its own directory is fenced by
// that directory, made before its execution starts and kept while it may
// run; a shared workspace outlives its Runs, so its existence says
// nothing of this one. For such a task runtimed makes an empty file named
// by the Run's UID in its own state directory (Config.StateDir: a volume
// of the runtimed container alone, kept while the pod lives, out of the
// Runs' reach) before it starts the execution, and removes it once the
// worker is done with the Run. A restarted runtimed that finds the mark
// of a Run still Scheduled adopts it, never starts it again.

// takenDir is the directory of the marks under Config.StateDir.
const takenDir = "taken"

// initTaken makes the marks' directory; "" (with the error logged) when
// there is no state directory or it cannot be made: tasks in a shared
// workspace are then claimed before they start.
func (d *Daemon) initTaken() string {
	if d.cfg.StateDir == "" {
		return ""
	}
	dir := filepath.Join(d.cfg.StateDir, takenDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		d.log.Warn("runtimed's state directory: tasks in a shared workspace are claimed before they start", "error", err)
		return ""
	}
	return dir
}

func (d *Daemon) markPath(uid string) string { return filepath.Join(d.taken, uid) }

// wasTaken reports whether a previous runtimed of this pod took the task
// Run uid and may have started it: its mark exists (shared), or its own
// directory dir does.
func (d *Daemon) wasTaken(uid, dir string, shared bool) bool {
	if shared {
		dir = d.markPath(uid)
	}
	_, err := os.Lstat(dir)
	return err == nil
}

// markTaken makes the mark of uid, before its execution starts.
func (d *Daemon) markTaken(uid string) error {
	f, err := os.OpenFile(d.markPath(uid), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	return f.Close()
}

// unmarkTaken removes the mark of uid, if any.
func (d *Daemon) unmarkTaken(uid string) error {
	if d.taken == "" {
		return nil
	}
	if err := os.Remove(d.markPath(uid)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// sweepTaken removes the marks no Run needs any more: those of Runs that
// are neither among runs (this pod's, as its informer first listed them)
// unended nor held by a worker. A runtimed that stopped while a worker
// ran leaves its mark for the next one; when the Run ended or went
// meanwhile, nothing else would remove it. d.mu is held.
func (d *Daemon) sweepTakenLocked(runs []*v1alpha1.Run) {
	if d.taken == "" {
		return
	}
	entries, err := os.ReadDir(d.taken)
	if err != nil {
		d.log.Warn("reading the marks of taken runs", "error", err)
		return
	}
	live := make(map[string]bool, len(runs))
	for _, r := range runs {
		if r.Status.AssignedPodUID == d.cfg.Pod.UID && !r.Status.Phase.Terminal() {
			live[string(r.UID)] = true
		}
	}
	for _, e := range entries {
		uid := e.Name()
		if live[uid] || d.workers[uid] != nil {
			continue
		}
		if err := d.unmarkTaken(uid); err != nil {
			d.log.Warn("removing the mark of a taken run", "run_uid", uid, "error", err)
		}
	}
}
