package lambda

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	agentv1 "stoke.dev/stoke/api/agent/v1"
	"stoke.dev/stoke/internal/artifact"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/exec/agent"
	"stoke.dev/stoke/internal/podcopy"
	"stoke.dev/stoke/internal/tarsafe"
)

// A task of a job's shared workspace is one invocation of its own, whose
// sandbox goes with it; so that the job's next step (and its artifact
// steps) see what it wrote, its directory is written back: the task runs
// in a copy of the package under the sandbox's /tmp, and when it ends the
// bootstrap holds the invocation and says so through its agent's watch
// (agentv1.TaskEnded), with what the task removed of the package's
// entries and a list of what it added or changed. This server removes
// the former from the workspace (removeDeleted: every name checked, none
// through a link, through an os.Root), then runs `tar` of the listed
// entries in that directory through an exec session, checks every entry
// (podcopy.CopyChecked, the tarsafe rules: nothing named outside, no link
// that leaves, no device), writes them into the workspace through an
// os.Root (artifact.Extract), bounded by Config.WriteBackBytes and
// bounds.WriteBackEntries, and releases the invocation.

// sharedWorkspacePrefix starts the directory name of a job's shared
// workspace (runtimed's "ws-NAME", which no Run UID can be).
const sharedWorkspacePrefix = "ws-"

// writeBackRoom is a write-back task's function timeout beyond its task's
// deadline: the time to copy its directory back.
const writeBackRoom = time.Minute

// writesBack reports whether a task in dir is written back: dir is a
// shared workspace, and the package carries it (an image function's
// sandbox holds the image's code, not the workspace).
func (s *Server) writesBack(dir string) bool {
	return s.cfg.Image == "" && strings.HasPrefix(filepath.Base(dir), sharedWorkspacePrefix)
}

// errNotWrittenBack says why a write-back did not happen.
var errNotWrittenBack = errors.New("the invocation ended before it said its task had ended (its agent never connected, or the sandbox failed)")

// writeBack waits within ctx for g's task to end, copies the sandbox's
// directory into dir (skipping skip, the package's entries that are not
// the workspace's) within copyCtx, and releases the invocation, whatever
// the copy's outcome. A task whose Run was cancelled or timed out
// (copyCtx ended) is released without a copy, and a copy under way stops:
// the job's next step (an if: always() one) may be running in dir by
// then.
func (s *Server) writeBack(ctx, copyCtx context.Context, g *agent.Grant, dir, uid string, skip map[string]bool) error {
	select {
	case <-g.TaskEnded():
	case <-ctx.Done():
		return errNotWrittenBack
	}
	start := time.Now()
	err := copyCtx.Err()
	if err == nil {
		err = s.copyBack(copyCtx, taskKey(dir), dir, uid, skip, g.Ended())
	}
	rctx, cancel := context.WithTimeout(s.bgCtx, 5*time.Second)
	defer cancel()
	if rerr := g.Release(rctx); rerr != nil {
		s.log.Warn("releasing the task's invocation after its write-back failed; it ends at its deadline", "run_uid", uid, "error", rerr)
	}
	s.observe("write-back", start)
	return err
}

// WriteBack is what one write-back did, as Config.WroteBack hears it.
type WriteBack struct {
	RunUID string
	// Sent is how many entries the sandbox named new or changed, all of
	// which were copied; Deleted how many names it said the step removed
	// (a directory counts once); Unchanged how many it left alone. A
	// sandbox that says nothing of its changes has its whole directory
	// copied: Whole, with Sent the entries that came.
	Sent, Deleted, Unchanged int64
	Whole                    bool
}

// copyBack makes dir what the sandbox's directory is, as ended says: it
// removes what the step removed, then streams `tar` of the new and
// changed entries through the task's agent into dir. A sandbox that
// lists no changes (an older bootstrap) has its whole directory copied,
// and nothing removed.
func (s *Server) copyBack(ctx context.Context, key, dir, uid string, skip map[string]bool, ended *agentv1.TaskEnded) error {
	wb := WriteBack{RunUID: uid}
	err := s.copyChanges(ctx, key, dir, uid, skip, ended, &wb)
	if err != nil {
		return fmt.Errorf("writing the sandbox's workspace back into %s: %w", filepath.Base(dir), err)
	}
	s.log.Debug("workspace written back", "run_uid", uid, "sent", wb.Sent, "deleted", wb.Deleted, "unchanged", wb.Unchanged, "whole", wb.Whole)
	if s.cfg.WroteBack != nil {
		s.cfg.WroteBack(wb)
	}
	return nil
}

func (s *Server) copyChanges(ctx context.Context, key, dir, uid string, skip map[string]bool, ended *agentv1.TaskEnded, wb *WriteBack) error {
	script, args := "exec tar -c -f - .", []string(nil)
	switch {
	case ended.GetError() != "":
		return errors.New(ended.GetError())
	case ended.GetDeletedOverBound():
		return errdefs.Errorf(errdefs.ErrTooLarge, "the step removed more than %d paths (or %d bytes of their names) that the workspace held; remove their directory instead",
			bounds.WriteBackDeletions, bounds.WriteBackDeletionBytes)
	case ended.GetChangesList() == "" || s.wholeWriteBack.Load():
		wb.Whole = true
	default:
		if err := removeDeleted(dir, ended.GetDeleted(), skip); err != nil {
			return err
		}
		wb.Deleted, wb.Unchanged = int64(len(ended.GetDeleted())), ended.GetUnchanged()
		if ended.GetChanged() == 0 {
			return nil
		}
		if ended.GetChanged() > bounds.WriteBackEntries {
			return errdefs.Errorf(errdefs.ErrTooLarge, "the step changed %d entries, over the %d one write-back copies", ended.GetChanged(), bounds.WriteBackEntries)
		}
		// Names verbatim, one per NUL, not recursing: a new directory's
		// entries are listed themselves.
		script, args = `exec tar -c -f - --null --verbatim-files-from --no-recursion -T "$1"`, []string{ended.GetChangesList()}
	}
	x := s.agents.Executor(func(context.Context, exec.Request) (string, error) { return key, nil })
	target := podcopy.Target{Exec: x, RunUID: uid, Name: "the Lambda sandbox"}
	limit := s.cfg.WriteBackBytes
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	tarred := make(chan error, 1)
	go func() {
		err := podcopy.Script(ctx, target, script, args, nil, &podcopy.LimitWriter{W: pw, Left: limit, Limit: limit})
		pw.CloseWithError(err)
		tarred <- err
	}()
	fr, fw := io.Pipe()
	filtered := make(chan error, 1)
	go func() {
		n, err := filterTar(fw, pr, skip, bounds.WriteBackEntries)
		wb.Sent = int64(n)
		fw.CloseWithError(err)
		filtered <- err
	}()
	_, err := artifact.Extract(dir, fr, limit)
	if err != nil {
		// The session is killed, the pipes closed: the others stop.
		cancel()
		fr.CloseWithError(errExtractionEnded)
	}
	ferr := <-filtered // at the tar's end, once it has drained its padding
	pr.CloseWithError(errExtractionEnded)
	terr := <-tarred
	switch {
	case err != nil:
	case terr != nil:
		err = terr
	case ferr != nil:
		err = ferr
	}
	return err
}

var errExtractionEnded = errors.New("the extraction ended")

// filterTar copies the tar r to w without the entries named in skip and
// the package's bootstrap, and returns the entries copied: at most
// maxEntries.
func filterTar(w io.Writer, r io.Reader, skip map[string]bool, maxEntries int) (n int, _ error) {
	tr, tw := tar.NewReader(r), tar.NewWriter(w)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			// tar pads its output past the end marker (a record, 10 KiB
			// by default): read it, so that tar's last write is not cut
			// off.
			if _, err := io.Copy(io.Discard, io.LimitReader(r, 64<<10)); err != nil {
				return n, err
			}
			return n, tw.Close()
		}
		if err != nil {
			return n, err
		}
		name := path.Clean(hdr.Name)
		if name == "bootstrap" || skip[name] || name == "." {
			continue
		}
		if n++; n > maxEntries {
			return n, errdefs.Errorf(errdefs.ErrTooLarge, "the sandbox sent over %d entries", maxEntries)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return n, err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return n, err
		}
	}
}

// removeDeleted removes names (what the step removed in its sandbox)
// from dir. Every name is checked before any is removed: relative, no
// "..", no NUL (tarsafe.Escapes), not the workspace itself, and not
// through a symbolic link (an os.Root follows one that stays inside; a
// name the package carried has only directories above it), within
// bounds.WriteBackDeletions and bounds.WriteBackDeletionBytes. The
// removals go through an os.Root; a name already gone is skipped, as are
// the package's own entries (skip, the bootstrap). A link named is
// removed itself, never what it points to.
func removeDeleted(dir string, names []string, skip map[string]bool) error {
	if len(names) == 0 {
		return nil
	}
	if len(names) > bounds.WriteBackDeletions {
		return errdefs.Errorf(errdefs.ErrTooLarge, "the sandbox named %d removed paths, over %d", len(names), bounds.WriteBackDeletions)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	todo := make([]string, 0, len(names))
	size := 0
	for _, n := range names {
		q := bounds.Truncate(n, bounds.Quoted)
		if size += len(n); size > bounds.WriteBackDeletionBytes {
			return errdefs.Errorf(errdefs.ErrTooLarge, "the sandbox named over %d bytes of removed paths", bounds.WriteBackDeletionBytes)
		}
		clean := path.Clean(n)
		if n == "" || tarsafe.Escapes(n) || clean == "." {
			return errdefs.InvalidArgument("write-back", "removed path %q: names outside the workspace (absolute, '..' or the workspace itself)", q)
		}
		if clean == "bootstrap" || skip[clean] {
			continue
		}
		gone := false
		for d := path.Dir(clean); d != "." && !gone; d = path.Dir(d) {
			fi, err := root.Lstat(d)
			switch {
			case errors.Is(err, fs.ErrNotExist):
				gone = true
			case err != nil:
				return err
			case !fi.IsDir():
				return errdefs.InvalidArgument("write-back", "removed path %q: goes through %q, which is not a directory in the workspace (a symbolic link is not followed)", q, bounds.Truncate(d, bounds.Quoted))
			}
		}
		if !gone {
			todo = append(todo, clean)
		}
	}
	for _, n := range todo {
		if err := root.RemoveAll(n); err != nil {
			return err
		}
	}
	return nil
}
