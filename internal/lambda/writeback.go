package lambda

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"path/filepath"
	"strings"
	"time"

	"stoke.dev/stoke/internal/artifact"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/exec/agent"
	"stoke.dev/stoke/internal/podcopy"
)

// A task of a job's shared workspace is one invocation of its own, whose
// sandbox goes with it; so that the job's next step (and its artifact
// steps) see what it wrote, its directory is written back: the task runs
// in a copy of the package under the sandbox's /tmp, and when it ends the
// bootstrap holds the invocation and says so through its agent's watch
// (agentv1.TaskEnded); this server then runs `tar` in that directory
// through an exec session, checks every entry (podcopy.CopyChecked, the
// tarsafe rules: nothing named outside, no link that leaves, no device),
// writes them into the workspace through an os.Root (artifact.Extract),
// bounded by Config.WriteBackBytes, and releases the invocation.

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
		err = s.copyBack(copyCtx, taskKey(dir), dir, uid, skip)
	}
	rctx, cancel := context.WithTimeout(s.bgCtx, 5*time.Second)
	defer cancel()
	if rerr := g.Release(rctx); rerr != nil {
		s.log.Warn("releasing the task's invocation after its write-back failed; it ends at its deadline", "run_uid", uid, "error", rerr)
	}
	s.observe("write-back", start)
	return err
}

// copyBack streams `tar -c .` of the sandbox's directory through the
// task's agent into dir.
func (s *Server) copyBack(ctx context.Context, key, dir, uid string, skip map[string]bool) error {
	x := s.agents.Executor(func(context.Context, exec.Request) (string, error) { return key, nil })
	target := podcopy.Target{Exec: x, RunUID: uid, Name: "the Lambda sandbox"}
	limit := s.cfg.WriteBackBytes
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	tarred := make(chan error, 1)
	go func() {
		err := podcopy.Script(ctx, target, "exec tar -c -f - .", nil, nil, &podcopy.LimitWriter{W: pw, Left: limit, Limit: limit})
		pw.CloseWithError(err)
		tarred <- err
	}()
	fr, fw := io.Pipe()
	filtered := make(chan error, 1)
	go func() {
		err := filterTar(fw, pr, skip)
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
	if err != nil {
		return fmt.Errorf("writing the sandbox's workspace back into %s: %w", filepath.Base(dir), err)
	}
	return nil
}

var errExtractionEnded = errors.New("the extraction ended")

// filterTar copies the tar r to w without the entries named in skip and
// the package's bootstrap.
func filterTar(w io.Writer, r io.Reader, skip map[string]bool) error {
	tr, tw := tar.NewReader(r), tar.NewWriter(w)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			// tar pads its output past the end marker (a record, 10 KiB
			// by default): read it, so that tar's last write is not cut
			// off.
			if _, err := io.Copy(io.Discard, io.LimitReader(r, 64<<10)); err != nil {
				return err
			}
			return tw.Close()
		}
		if err != nil {
			return err
		}
		name := path.Clean(hdr.Name)
		if name == "bootstrap" || skip[name] {
			continue
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
}
