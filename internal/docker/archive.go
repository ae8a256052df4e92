package docker

import (
	"bufio"
	"bytes"
	"compress/bzip2"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/podcopy"
)

// `docker cp`: the archive endpoints move a tar through an exec session
// into the Run (package podcopy: tar runs there, as the Run's user, in its
// working directory), so they reach wherever exec does. A container's
// root is its Run's working directory: a path is relative to it, with or
// without a leading '/', and must resolve inside it.

// archivePath checks the path a client names, without "..", and makes it
// relative to the working directory ("/" is the working directory).
func archivePath(r *http.Request) (string, error) {
	p := r.URL.Query().Get("path")
	if strings.HasPrefix(p, "/") {
		if p = strings.TrimLeft(p, "/"); p == "" {
			p = "."
		}
	}
	return p, podcopy.CheckPath("path", p)
}

// decompressed is the body of a PUT, a tar that Docker accepts
// compressed too: gzip and bzip2 are read as the tar they hold (the
// bound applies to the tar); anything else goes on as it is.
func decompressed(body io.Reader) (io.Reader, error) {
	br := bufio.NewReader(body)
	magic, _ := br.Peek(3)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, errdefs.InvalidArgument("body", "not a gzip-compressed tar: %v", err)
		}
		return zr, nil
	case bytes.Equal(magic, []byte("BZh")):
		return bzip2.NewReader(br), nil
	}
	return br, nil
}

// copyTarget is the container's Run, for package podcopy.
func (s *Server) copyTarget(c *ctr) (podcopy.Target, error) {
	if !c.running() {
		return podcopy.Target{}, errdefs.Errorf(errdefs.ErrNotRunning, "container %s is not running: docker cp reaches a running container's working directory", c.id[:12])
	}
	x, uid, err := s.cfg.Backend.ExecRoute(c.run.Namespace, c.run.Name)
	if err != nil {
		return podcopy.Target{}, err
	}
	return podcopy.Target{Exec: x, RunUID: uid, Name: "container " + c.name}, nil
}

// statPath is the PathStat of a path in the container.
func (s *Server) statPath(ctx context.Context, c *ctr, p string) (container.PathStat, error) {
	t, err := s.copyTarget(c)
	if err != nil {
		return container.PathStat{}, err
	}
	st, err := podcopy.StatPath(ctx, t, p)
	if err != nil {
		return container.PathStat{}, err
	}
	mode := fs.FileMode(st.Mode & 0o777)
	switch st.Mode & 0o170000 {
	case 0o040000:
		mode |= fs.ModeDir
	case 0o120000:
		mode |= fs.ModeSymlink
	}
	return container.PathStat{Name: path.Base(p), Size: st.Size, Mode: mode, Mtime: time.Unix(st.Mtime, 0).UTC()}, nil
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
	t, err := s.copyTarget(c)
	if err == nil {
		err = podcopy.Get(r.Context(), t, p, w, bounds.DockerArchive)
	}
	if err != nil {
		// The status is sent: the client sees a short tar.
		s.log.Info("docker cp from a container ended early", "container", c.id[:12], "error", err)
	}
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
	t, err := s.copyTarget(c)
	var body io.Reader
	if err == nil {
		body, err = decompressed(r.Body)
	}
	if err == nil {
		err = podcopy.Put(r.Context(), t, p, body, bounds.DockerArchive)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}
