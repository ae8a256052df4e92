package bootstrap

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	agentv1 "stoke.dev/stoke/api/agent/v1"
	"stoke.dev/stoke/internal/runtime"
)

// A task of a job's shared workspace (payload.Task.WriteBack) runs in a
// copy of the package under /tmp, since the task root is read-only on
// AWS; when it ends, the invocation holds with its agent up and says so
// (agentv1.TaskEnded), the Runtime Server copies that directory back into
// the workspace through an exec session, and releases the invocation.

// initHeld makes the tasks table of write-back tasks, whose working
// directories are under <scratch>/workspace.
func (b *Bootstrap) initHeld(adapter runtime.Adapter, scratch string) error {
	b.heldRoot = filepath.Join(scratch, "workspace")
	if err := os.MkdirAll(b.heldRoot, 0o700); err != nil {
		return err
	}
	ws, err := runtime.NewWorkspace(b.heldRoot)
	if err != nil {
		return err
	}
	b.held, err = runtime.NewTasks(runtime.TasksConfig{Adapter: adapter, Workspace: ws,
		ScratchRoot: filepath.Join(scratch, "held-tasks"), Logger: b.log, KillGrace: taskKillGrace, BaseEnv: b.base})
	return err
}

// hold is one write-back task's directory and the invocation's hold after
// the task.
type hold struct {
	dir string
	// list names the new and changed entries for the Runtime Server's
	// tar (outside dir, so not one of them).
	list     string
	rec      *record
	event    *agentv1.TaskEnded // set before ended is closed
	ended    chan struct{}      // closed when the task has ended
	released chan struct{}      // closed by release
	once     sync.Once
}

// newHold copies the package (but the bootstrap) into a fresh directory
// for the task of requestID, recording what the copy made.
func (b *Bootstrap) newHold(requestID string) (*hold, error) {
	dir := filepath.Join(b.heldRoot, requestID)
	list := dir + ".changes"
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	rec := &record{src: b.cfg.TaskRoot, entries: map[string]state{}}
	if err := copyTree(b.cfg.TaskRoot, dir, rec); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("copying the workspace into %s: %w", dir, err)
	}
	// The list file, made now, is the probe of the copy's tick.
	err := os.WriteFile(list, nil, 0o600)
	if err == nil {
		err = rec.seal(list)
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &hold{dir: dir, list: list, rec: rec, ended: make(chan struct{}), released: make(chan struct{})}, nil
}

func (h *hold) release() { h.once.Do(func() { close(h.released) }) }

// await lists what the task changed, says the task ended and holds until
// the release or the invocation's deadline (less its margin), whichever
// comes first.
func (h *hold) await(deadline time.Time) {
	h.event = h.rec.taskEnded(h.dir, h.list)
	close(h.ended)
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline.Add(-deadlineMargin)))
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-h.released:
	case <-timeout:
	}
}

// remove deletes the directory, after the copy back.
func (h *hold) remove() {
	h.release()
	_ = os.RemoveAll(h.dir)
	_ = os.Remove(h.list)
}

// taskEnded is the event await made; called once ended is closed.
func (h *hold) taskEnded() *agentv1.TaskEnded { return h.event }

// copyTree copies src's regular files, directories and symbolic links
// into dst, made writable by their owner (the package's files are
// read-only), leaving out the bootstrap at src's root, and records each
// entry it made in rec.
func copyTree(src, dst string, rec *record) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if rel == "bootstrap" {
			return nil
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			err = os.MkdirAll(target, info.Mode().Perm()|0o700)
		case d.Type()&fs.ModeSymlink != 0:
			var link string
			if link, err = os.Readlink(path); err == nil {
				err = os.Symlink(link, target)
			}
		case d.Type().IsRegular():
			err = copyFile(path, target, info.Mode().Perm()|0o600)
		default:
			return nil // nothing else is packaged
		}
		if err != nil || rel == "." {
			return err
		}
		return rec.add(rel, target)
	})
}

func copyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
