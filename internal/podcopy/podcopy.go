// Package podcopy copies a directory subtree out of and into a live Run as
// a tar through an exec session: tar runs in the Run, as its user, in its
// working directory, so a copy reaches wherever exec does (a local pod,
// runtimed's hop in Kubernetes, the Lambda reverse agent). `docker cp`
// (internal/docker) and workflow artifacts (internal/artifact) share it.
//
// Paths are relative to the Run's working directory and must resolve, links
// followed, inside it; a tar going in is checked entry by entry before tar
// sees it (CopyChecked), so that nothing it writes lands outside the
// directory it is extracted in.
package podcopy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
)

// Target is the Run a copy goes through: the executor of its pod's hop and
// the Run's ID at that hop (its UID at runtimed's hop, as
// gateway.ExecRouter answers).
type Target struct {
	Exec   exec.Executor
	RunUID string
	// Name names the Run in errors (a container's name for docker cp).
	Name string
}

// ResolveScript resolves $1 inside the working directory ($PWD), following
// links, and refuses a path that leaves it (exit 5) or does not exist
// (exit 4); the path is an argument, never part of the script. Scripts
// that use it continue with the resolved path in $p.
const ResolveScript = `p=$(realpath -e -- "$1") || exit 4
case "$p/" in "$PWD"/*) ;; *) echo "$1 resolves outside the working directory" >&2; exit 5;; esac
`

// The scripts Stat, Get and Put run after ResolveScript.
const (
	statScript = ResolveScript + `exec stat -c '%s %f %Y' -- "$p"`
	getScript  = ResolveScript + `cd -- "$(dirname -- "$p")" && exec tar -c -f - -- "$(basename -- "$p")"`
	putScript  = ResolveScript + `[ -d "$p" ] || { echo "$1 is not a directory" >&2; exit 6; }
cd -- "$p" && exec tar -x --no-same-owner --no-same-permissions -f -`
)

// CheckPath checks a path a client names: relative to the working
// directory, without "..", no NUL, at most bounds.Arg bytes. field names it
// in the error.
func CheckPath(field, p string) error {
	switch {
	case p == "":
		return errdefs.InvalidArgument(field, "is required")
	case len(p) > bounds.Arg || strings.IndexByte(p, 0) >= 0:
		return errdefs.InvalidArgument(field, "is not a path")
	case strings.HasPrefix(p, "/"):
		return errdefs.InvalidArgument(field, "%s: paths are relative to the Run's working directory", bounds.Truncate(p, bounds.Quoted))
	}
	for part := range strings.SplitSeq(p, "/") {
		if part == ".." {
			return errdefs.InvalidArgument(field, "%s: must not contain '..'", bounds.Truncate(p, bounds.Quoted))
		}
	}
	return nil
}

// Script runs script with args in the target Run (sh -c script podcopy
// ARGS...). Exit 0 is nil; any other exit is an *ExitError: the exit codes
// of ResolveScript are NotFound (4) and InvalidArgument (5, and 6 for
// scripts that refuse their argument), carrying the script's stderr; any
// other is Internal.
func Script(ctx context.Context, t Target, script string, args []string, stdin io.Reader, stdout io.Writer) error {
	return shell(ctx, t, "sh", script, args, stdin, stdout)
}

// BashScript is Script with bash, for scripts that need its globs.
func BashScript(ctx context.Context, t Target, script string, args []string, stdin io.Reader, stdout io.Writer) error {
	return shell(ctx, t, "bash", script, args, stdin, stdout)
}

func shell(ctx context.Context, t Target, sh, script string, args []string, stdin io.Reader, stdout io.Writer) error {
	cmd := append([]string{sh, "-c", script, "podcopy"}, args...)
	sess, err := t.Exec.Start(ctx, exec.Request{RunUID: t.RunUID, Command: cmd, Stdin: stdin != nil})
	if err != nil {
		return err
	}
	defer sess.Close()
	var errOut Buffer
	exit, err := sess.Stream(ctx, exec.Streams{Stdin: stdin, Stdout: stdout, Stderr: &errOut})
	if err != nil {
		return err
	}
	if exit.Code == 0 {
		return nil
	}
	msg := strings.TrimSpace(bounds.Truncate(errOut.String(), bounds.Quoted*4))
	switch exit.Code {
	case 4:
		what := ""
		if len(args) > 0 {
			what = bounds.Truncate(args[0], bounds.Quoted)
		}
		return &ExitError{Code: 4, msg: fmt.Sprintf("Could not find the file %s in %s", what, t.Name), category: errdefs.ErrNotFound}
	case 5, 6:
		return &ExitError{Code: exit.Code, msg: msg, category: errdefs.ErrInvalidArgument}
	}
	return &ExitError{Code: exit.Code, msg: fmt.Sprintf("copy in %s: exit %d: %s", t.Name, exit.Code, msg), category: errdefs.ErrInternal}
}

// ExitError is a script's exit other than 0: its code, its stderr in the
// message, and an errdefs category (Script says which).
type ExitError struct {
	Code     int
	msg      string
	category error
}

func (e *ExitError) Error() string { return e.msg }
func (e *ExitError) Unwrap() error { return e.category }

// Stat is what stat says of a path in the Run: its size, raw st_mode (hex)
// and modification time (Unix seconds).
type Stat struct {
	Size  int64
	Mode  uint32
	Mtime int64
}

// IsDir reports whether the path is a directory.
func (s Stat) IsDir() bool { return s.Mode&0o170000 == 0o040000 }

// StatPath stats p (relative to the working directory, resolved inside it).
func StatPath(ctx context.Context, t Target, p string) (Stat, error) {
	var out Buffer
	if err := Script(ctx, t, statScript, []string{p}, nil, &out); err != nil {
		return Stat{}, err
	}
	var st Stat
	var raw string
	if _, err := fmt.Sscanf(out.String(), "%d %s %d", &st.Size, &raw, &st.Mtime); err != nil {
		return Stat{}, errdefs.Errorf(errdefs.ErrInternal, "stat in %s: %q", t.Name, out.String())
	}
	var mode uint64
	if _, err := fmt.Sscanf(raw, "%x", &mode); err != nil || mode > 1<<32-1 {
		return Stat{}, errdefs.Errorf(errdefs.ErrInternal, "stat in %s: mode %q", t.Name, raw)
	}
	st.Mode = uint32(mode)
	return st, nil
}

// Get writes a tar of p (one entry named by its base name, a directory
// with its tree) to w, at most limit bytes (past it: TooLarge).
func Get(ctx context.Context, t Target, p string, w io.Writer, limit int64) error {
	return Script(ctx, t, getScript, []string{p}, nil, &LimitWriter{W: w, Left: limit, Limit: limit})
}

// Put extracts the tar r into the directory dir of the Run. Each entry is
// checked before tar sees it (CopyChecked, at most limit bytes); a bad one
// kills the extraction and is the error. Entries before it may have been
// written, all inside dir.
func Put(ctx context.Context, t Target, dir string, r io.Reader, limit int64) error {
	return PutScript(ctx, t, putScript, []string{dir}, r, limit)
}

// PutScript is Put with the caller's script, which must end in a tar -x
// reading stdin (download-artifact's makes its directory first).
func PutScript(ctx context.Context, t Target, script string, args []string, r io.Reader, limit int64) error {
	pr, pw := io.Pipe()
	checked := make(chan error, 1)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		err := CopyChecked(pw, io.LimitReader(r, limit+1), limit)
		if err != nil {
			// tar stops here: its session is killed, not fed an end.
			cancel()
		}
		pw.CloseWithError(err)
		checked <- err
	}()
	err := Script(ctx, t, script, args, pr, io.Discard)
	pr.CloseWithError(errExtractionEnded)
	if cerr := <-checked; cerr != nil && cerr != io.ErrClosedPipe && cerr != errExtractionEnded {
		err = cerr
	}
	return err
}

var errExtractionEnded = fmt.Errorf("the extraction ended")

// LimitWriter refuses writes past its bound with TooLarge.
type LimitWriter struct {
	W           io.Writer
	Left, Limit int64
}

func (l *LimitWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.Left {
		return 0, errdefs.Errorf(errdefs.ErrTooLarge, "the archive is over %d bytes", l.Limit)
	}
	l.Left -= int64(len(p))
	return l.W.Write(p)
}

// Buffer keeps the first 64 KiB written to it and drops the rest: a
// command's stderr or a short answer.
type Buffer struct{ b bytes.Buffer }

func (b *Buffer) Write(p []byte) (int, error) {
	if room := 64<<10 - b.b.Len(); room > 0 {
		b.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// String is what was kept.
func (b *Buffer) String() string { return b.b.String() }

// Bytes is what was kept.
func (b *Buffer) Bytes() []byte { return b.b.Bytes() }
