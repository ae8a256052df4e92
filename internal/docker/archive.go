package docker

import (
	"archive/tar"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
)

// `docker cp`: the archive endpoints move a tar through an exec session
// into the Run (tar runs there, as the Run's user, in its working
// directory), so they reach wherever exec does. Paths are relative to the
// Run's working directory and must resolve inside it.

// resolveScript resolves $1 inside the working directory ($PWD), following
// links, and refuses a path that leaves it; the path is an argument,
// never part of the script.
const resolveScript = `p=$(realpath -e -- "$1") || exit 4
case "$p/" in "$PWD"/*) ;; *) echo "$1 resolves outside the working directory" >&2; exit 5;; esac
`

// The scripts each endpoint runs after resolveScript.
const (
	statScript = resolveScript + `exec stat -c '%s %f %Y' -- "$p"`
	getScript  = resolveScript + `cd -- "$(dirname -- "$p")" && exec tar -c -f - -- "$(basename -- "$p")"`
	putScript  = resolveScript + `[ -d "$p" ] || { echo "$1 is not a directory" >&2; exit 6; }
cd -- "$p" && exec tar -x --no-same-owner --no-same-permissions -f -`
)

// archivePath checks the path a client names: relative to the working
// directory, without "..".
func archivePath(r *http.Request) (string, error) {
	p := r.URL.Query().Get("path")
	switch {
	case p == "":
		return "", errdefs.InvalidArgument("path", "is required")
	case len(p) > bounds.Arg || strings.IndexByte(p, 0) >= 0:
		return "", errdefs.InvalidArgument("path", "is not a path")
	case strings.HasPrefix(p, "/"):
		return "", errdefs.InvalidArgument("path", "%s: a container's paths are relative to its Run's working directory on Stoke", bounds.Truncate(p, bounds.Quoted))
	}
	for part := range strings.SplitSeq(p, "/") {
		if part == ".." {
			return "", errdefs.InvalidArgument("path", "%s: must not contain '..'", bounds.Truncate(p, bounds.Quoted))
		}
	}
	return p, nil
}

// archiveSession runs script with the path in the container's Run; the
// exit codes of resolveScript become errors.
func (s *Server) archiveSession(ctx context.Context, c *ctr, script, p string, stdin io.Reader, stdout io.Writer) error {
	if !c.running() {
		return errdefs.Errorf(errdefs.ErrNotRunning, "container %s is not running: docker cp reaches a running container's working directory", c.id[:12])
	}
	x, uid, err := s.cfg.Backend.ExecRoute(c.run.Namespace, c.run.Name)
	if err != nil {
		return err
	}
	sess, err := x.Start(ctx, exec.Request{RunUID: uid, Command: []string{"sh", "-c", script, "docker-cp", p}, Stdin: stdin != nil})
	if err != nil {
		return err
	}
	defer sess.Close()
	var errOut boundedBuffer
	exit, err := sess.Stream(ctx, exec.Streams{Stdin: stdin, Stdout: stdout, Stderr: &errOut})
	if err != nil {
		return err
	}
	msg := strings.TrimSpace(bounds.Truncate(errOut.b.String(), bounds.Quoted*4))
	switch exit.Code {
	case 0:
		return nil
	case 4:
		return errdefs.Errorf(errdefs.ErrNotFound, "Could not find the file %s in container %s", bounds.Truncate(p, bounds.Quoted), c.name)
	case 5, 6:
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "%s", msg)
	}
	return errdefs.Errorf(errdefs.ErrInternal, "docker cp in container %s: exit %d: %s", c.name, exit.Code, msg)
}

// statPath is the PathStat of a path in the container.
func (s *Server) statPath(ctx context.Context, c *ctr, p string) (container.PathStat, error) {
	var out boundedBuffer
	if err := s.archiveSession(ctx, c, statScript, p, nil, &out); err != nil {
		return container.PathStat{}, err
	}
	var size, mtime int64
	var raw string
	if _, err := fmt.Sscanf(out.b.String(), "%d %s %d", &size, &raw, &mtime); err != nil {
		return container.PathStat{}, errdefs.Errorf(errdefs.ErrInternal, "stat in container %s: %q", c.name, out.b.String())
	}
	unixMode, err := strconv.ParseUint(raw, 16, 32)
	if err != nil {
		return container.PathStat{}, errdefs.Errorf(errdefs.ErrInternal, "stat in container %s: mode %q", c.name, raw)
	}
	mode := fs.FileMode(unixMode & 0o777)
	switch unixMode & 0o170000 {
	case 0o040000:
		mode |= fs.ModeDir
	case 0o120000:
		mode |= fs.ModeSymlink
	}
	return container.PathStat{Name: path.Base(p), Size: size, Mode: mode, Mtime: time.Unix(mtime, 0).UTC()}, nil
}

func setStatHeader(w http.ResponseWriter, st container.PathStat) {
	b, _ := json.Marshal(st)
	w.Header().Set("X-Docker-Container-Path-Stat", base64.StdEncoding.EncodeToString(b))
}

func (s *Server) archiveHead(w http.ResponseWriter, r *http.Request) {
	c, p, ok := s.archiveTarget(w, r)
	if !ok {
		return
	}
	st, err := s.statPath(r.Context(), c, p)
	if err != nil {
		writeError(w, err)
		return
	}
	setStatHeader(w, st)
	w.WriteHeader(http.StatusOK)
}

func (s *Server) archiveTarget(w http.ResponseWriter, r *http.Request) (*ctr, string, bool) {
	c, err := s.lookup(r.PathValue("id"))
	if err == nil {
		var p string
		if p, err = archivePath(r); err == nil {
			return c, p, true
		}
	}
	writeError(w, err)
	return nil, "", false
}

// archiveGet streams a tar of the path, at most bounds.DockerArchive bytes.
func (s *Server) archiveGet(w http.ResponseWriter, r *http.Request) {
	c, p, ok := s.archiveTarget(w, r)
	if !ok {
		return
	}
	st, err := s.statPath(r.Context(), c, p)
	if err != nil {
		writeError(w, err)
		return
	}
	setStatHeader(w, st)
	w.Header().Set("Content-Type", "application/x-tar")
	w.WriteHeader(http.StatusOK)
	out := &limitWriter{w: w, left: bounds.DockerArchive}
	if err := s.archiveSession(r.Context(), c, getScript, p, nil, out); err != nil {
		// The status is sent: the client sees a short tar.
		s.log.Info("docker cp from a container ended early", "container", c.id[:12], "error", err)
	}
}

// limitWriter refuses writes past its bound.
type limitWriter struct {
	w    io.Writer
	left int64
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.left {
		return 0, errdefs.Errorf(errdefs.ErrTooLarge, "the archive is over %d bytes", bounds.DockerArchive)
	}
	l.left -= int64(len(p))
	return l.w.Write(p)
}

// archivePut extracts the request's tar into the directory path. Each
// entry is checked before it goes on: a relative name without "..", a
// regular file, directory or link whose target stays inside; anything
// else (absolute names, escapes, devices, FIFOs) ends the copy with 400
// before it is written; entries before it may have been written, all
// inside the directory.
func (s *Server) archivePut(w http.ResponseWriter, r *http.Request) {
	c, p, ok := s.archiveTarget(w, r)
	if !ok {
		return
	}
	st, err := s.statPath(r.Context(), c, p)
	if err != nil {
		writeError(w, err)
		return
	}
	if !st.Mode.IsDir() {
		writeError(w, errdefs.InvalidArgument("path", "%s is not a directory", bounds.Truncate(p, bounds.Quoted)))
		return
	}
	pr, pw := io.Pipe()
	checked := make(chan error, 1)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	go func() {
		err := copyCheckedTar(pw, io.LimitReader(r.Body, bounds.DockerArchive+1))
		if err != nil {
			// tar stops here: its session is killed, not fed an end.
			cancel()
		}
		pw.CloseWithError(err)
		checked <- err
	}()
	err = s.archiveSession(ctx, c, putScript, p, pr, io.Discard)
	pr.CloseWithError(errors.New("the extraction ended"))
	if cerr := <-checked; cerr != nil && !errors.Is(cerr, io.ErrClosedPipe) {
		err = cerr
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// copyCheckedTar copies a tar entry by entry, refusing one that would
// write outside the directory it is extracted in.
func copyCheckedTar(dst io.Writer, src io.Reader) error {
	tr := tar.NewReader(src)
	tw := tar.NewWriter(dst)
	var total int64
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return tw.Close()
		}
		if err != nil {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "the archive is not a tar: %v", err)
		}
		if err := checkEntry(hdr); err != nil {
			return err
		}
		if total += hdr.Size; total > bounds.DockerArchive {
			return errdefs.Errorf(errdefs.ErrTooLarge, "the archive is over %d bytes", bounds.DockerArchive)
		}
		clean := &tar.Header{Typeflag: hdr.Typeflag, Name: hdr.Name, Linkname: hdr.Linkname, Size: hdr.Size,
			Mode: hdr.Mode & 0o777, ModTime: hdr.ModTime, Format: tar.FormatPAX}
		if err := tw.WriteHeader(clean); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
}

// checkEntry allows regular files, directories and links that stay within
// the directory the archive is extracted in.
func checkEntry(hdr *tar.Header) error {
	name := bounds.Truncate(hdr.Name, bounds.Quoted)
	if escapes(hdr.Name) {
		return errdefs.InvalidArgument("archive", "entry %q: names outside the destination (absolute or '..')", name)
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeDir:
	case tar.TypeSymlink:
		if strings.HasPrefix(hdr.Linkname, "/") || escapes(path.Join(path.Dir(hdr.Name), hdr.Linkname)) {
			return errdefs.InvalidArgument("archive", "entry %q: a link to %q, outside the destination", name, bounds.Truncate(hdr.Linkname, bounds.Quoted))
		}
	case tar.TypeLink:
		if escapes(hdr.Linkname) {
			return errdefs.InvalidArgument("archive", "entry %q: a hard link to %q, outside the destination", name, bounds.Truncate(hdr.Linkname, bounds.Quoted))
		}
	default:
		return errdefs.InvalidArgument("archive", "entry %q: type %q is not a file, directory or link (devices and FIFOs are refused)", name, string(hdr.Typeflag))
	}
	return nil
}

// escapes reports whether a tar name leaves the directory it is relative to.
func escapes(name string) bool {
	if strings.HasPrefix(name, "/") || strings.IndexByte(name, 0) >= 0 {
		return true
	}
	clean := path.Clean(name)
	return clean == ".." || strings.HasPrefix(clean, "../")
}
