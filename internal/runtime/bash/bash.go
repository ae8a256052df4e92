// Package bash is Stoke's built-in Bash runtime: one warm shell per function
// registration, and a fresh child of it per invocation.
//
// A handler "path/file.function" names the function "function" in
// "path/file.sh" under the working directory. Load starts one long-lived
// bash, in a process group of its own, running the embedded bootstrap.sh
// with the file and the function in its environment (not its arguments,
// which every user can read), never as script text. The bootstrap sources
// the file once, checks that the function exists and reports ready on a
// status pipe.
//
// Forking costs 0.5–2 ms here and every bash command tens of microseconds
// when cold, so the request path avoids the one and skimps on the other.
// The warm shell forks the next child as soon as the previous one has ended;
// that child, in a process group of its own (job control is on while
// forking), announces itself, restores the handler file's shell options and
// blocks reading a control pipe. Every invocation thus starts from the state
// right after registration: a global a handler sets dies with its child.
//
// One invocation N:
//
//   - Before it comes, a background goroutine has created the request file
//     req.N (one page of zeros, so that writing the request does not grow a
//     file) and the FIFO out.N in the instance's scratch directory, and
//     opened the FIFO for reading (non-blocking) and for writing (a
//     "keeper" write end, so that reading does not see end-of-file before
//     the child opens it). After an answer at the trailer that goroutine
//     starts when the warm shell announces its next child, once the reply
//     has left: right after the answer its work would compete with the
//     reply. A request that comes before the announcement does it itself.
//   - Invoke writes the invocation ID, the payload and the invocation's
//     scope (runtime.Invocation.Scope) over req.N (bash reads
//     a regular file in blocks, a pipe one byte at a time) and the line "N"
//     to the control pipe.
//   - The child reads "N", reads req.N into MAPFILE and calls the function
//     with the payload as its one argument, STOKE_INVOCATION_ID,
//     STOKE_SCOPE and STOKE_OUTPUTS in its environment and its stdout on
//     out.N. No request
//     byte is ever parsed as shell.
//   - Invoke reads the FIFO itself while the function runs. When the
//     function returns, the child writes a trailer after its output,
//     "\x1eNONCE done N PID STATUS": Invoke stops reading there and answers
//     without waiting for the child's exit. The child exits right after
//     the trailer, so that the warm shell reaps it and forks the next one
//     while Go answers: that fork, not the answer, bounds calls back to
//     back. Anything else that ends the wait (ctx, the child's exit, the
//     warm shell's death) wakes the read with a deadline in the past.
//   - The warm shell reports every child's end, "exit PID STATUS PENDING"
//     (PENDING says whether the child died before it read a control line),
//     and Go kills what is left of the child's process group. A child that
//     ends without a trailer (exit, set -e, a signal) ends its invocation
//     with that status; one whose exit is reported before Go has read its
//     trailer still answers with the trailer's.
//   - When ctx ends (or stdout passes bounds.InvokeBody), Invoke removes
//     req.N, so that no child can take it any more, reads the status pipe up
//     to that moment, kills the process group of the child alive then and
//     waits for the warm shell to report it: the next child is forked after
//     that. A line left in the control pipe names a request file that no
//     longer exists, and the next child skips it.
//
// Stdout is read while the handler runs and kept up to bounds.InvokeBody
// bytes (and the trailer); the rest is read and dropped, so a flood neither
// blocks the handler nor fills a disk, and passing the bound kills the
// child at once.
//
// Stderr of the warm shell and all its children is one pipe, read by one
// goroutine per instance and logged line by line (bounded by
// internal/loglines) with the run UID and the invocation ID of the
// invocation it belongs to: after each invocation Go writes a sync marker
// (a nonce and a number) into the pipe, and the lines before it are the
// invocation's. The same goroutine keeps a short tail of each invocation's
// stderr, which a non-zero exit carries as its stack trace; such an
// invocation waits for its sync marker before it returns.
package bash

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"time"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/runtime"
	"stoke.dev/stoke/internal/validation"
)

// bootstrapSource is the warm shell's program. It is passed with -c and
// receives everything variable in its environment.
//
//go:embed bootstrap.sh
var bootstrapSource string

// bootstrap is bootstrapSource without comment lines and indentation: the
// script is the warm shell's argv, shown by ps.
var bootstrap = func() string {
	var b strings.Builder
	for line := range strings.Lines(bootstrapSource) {
		line = strings.TrimLeft(line, "\t ")
		if line == "\n" || strings.HasPrefix(line, "#") {
			continue
		}
		b.WriteString(line)
	}
	return b.String()
}()

// Config configures the Bash adapter.
type Config struct {
	// BashPath is the bash binary; empty means "bash" from PATH, resolved
	// once by New.
	BashPath string
	// CloseGrace bounds how long Close (and an invocation, after its
	// handler ended) waits for pipes that a process which escaped its
	// process group still holds open. Zero means one second.
	CloseGrace time.Duration
}

// Adapter is the Bash runtime.Adapter.
type Adapter struct {
	bash    string
	bashErr error // why no bash was found; reported by Load and TaskCommand
	grace   time.Duration
}

var _ runtime.Adapter = (*Adapter)(nil)

// New returns the Bash adapter.
func New(cfg Config) *Adapter {
	a := &Adapter{bash: cfg.BashPath, grace: cfg.CloseGrace}
	if a.grace <= 0 {
		a.grace = time.Second
	}
	if a.bash == "" {
		p, err := exec.LookPath("bash")
		if err != nil {
			a.bashErr = fmt.Errorf("bash runtime: %w", err)
		}
		a.bash = p
	}
	return a
}

// Name implements runtime.Adapter.
func (a *Adapter) Name() string { return "bash" }

var funcNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// parseHandler splits "path/file.function" at its last '.' into the file
// ("path/file.sh") and the function name.
func parseHandler(h string) (file, fn string, err error) {
	i := strings.LastIndexByte(h, '.')
	if i < 0 {
		return "", "", fmt.Errorf("%q must have the form file.function", h)
	}
	base, fn := h[:i], h[i+1:]
	switch {
	case !funcNameRE.MatchString(fn):
		return "", "", fmt.Errorf("function name %q must match [A-Za-z_][A-Za-z0-9_]*", fn)
	case base == "":
		return "", "", fmt.Errorf("%q has no file name before the function", h)
	case strings.IndexByte(base, 0) >= 0:
		return "", "", errors.New("file name contains a NUL byte")
	case strings.HasPrefix(base, "/"):
		return "", "", fmt.Errorf("file %q must be relative to the working directory", base)
	case strings.HasSuffix(base, "/"):
		return "", "", fmt.Errorf("file %q names a directory", base)
	}
	for _, el := range strings.Split(base, "/") {
		if el == ".." {
			return "", "", fmt.Errorf("file %q must not contain '..'", base)
		}
	}
	return base + ".sh", fn, nil
}

// ValidateHandler implements runtime.Adapter.
func (a *Adapter) ValidateHandler(h string) error {
	_, _, err := parseHandler(h)
	return err
}

// TaskCommand implements runtime.Adapter: a one-shot task runs its
// entrypoint with bash, or, without one, runs args directly.
func (a *Adapter) TaskCommand(entrypoint string, args []string, _ time.Duration) ([]string, error) {
	if entrypoint == "" {
		if len(args) == 0 {
			return nil, errors.New("task needs an entrypoint or args")
		}
		return append([]string(nil), args...), nil
	}
	if a.bashErr != nil {
		return nil, a.bashErr
	}
	if err := validation.RelativePath("entrypoint", entrypoint); err != nil {
		return nil, err
	}
	// bash looks a script name without a slash up in PATH when the working
	// directory has no such file; "./" pins it to the working directory.
	if !strings.Contains(entrypoint, "/") {
		entrypoint = "./" + entrypoint
	}
	return append([]string{a.bash, entrypoint}, args...), nil
}

// Load implements runtime.Adapter: it starts the warm shell and waits until
// it has sourced the handler file and found the function.
func (a *Adapter) Load(ctx context.Context, spec runtime.FunctionSpec) (runtime.Instance, error) {
	if a.bashErr != nil {
		return nil, a.bashErr
	}
	file, fn, err := parseHandler(spec.Handler)
	if err != nil {
		return nil, fmt.Errorf("handler %q: %w", spec.Handler, err)
	}
	path, err := runtime.ResolveInside(spec.WorkingDir, file)
	if err != nil {
		return nil, fmt.Errorf("handler file: %w", err)
	}
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("handler file %s does not exist in the working directory", file)
	case err != nil:
		return nil, fmt.Errorf("handler file %s: %w", file, err)
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("handler file %s is not a regular file", file)
	}
	spec.Logger = logging.OrDiscard(spec.Logger)
	if spec.Output == nil {
		spec.Output = runtime.DiscardOutput
	}
	var nonce [8]byte
	_, _ = rand.Read(nonce[:]) // never fails on Linux

	in, err := start(a, spec, path, fn, hex.EncodeToString(nonce[:]))
	if err != nil {
		return nil, fmt.Errorf("start bash: %w", err)
	}
	select {
	case <-in.initDone:
	case <-in.proc.Done():
		// Whatever it reported before it died has been read after this.
		in.sync(in.statusW, nil, true)
	case <-ctx.Done():
		_ = in.Close()
		return nil, fmt.Errorf("loading %s: %w", file, ctx.Err())
	}
	status := "" // the shell died while loading
	select {
	case <-in.initDone:
		status = in.initMsg
	default:
	}
	if status == "ready" {
		// What the file printed while it was sourced is logged as the
		// registration's, not as the first invocation's.
		in.sync(in.stderrW, nil, true)
		return in, nil
	}
	// Close first: it waits for stderr to be drained, so the tail below
	// holds bash's own words (a syntax error, a missing command).
	_ = in.Close()
	var msg string
	switch {
	case strings.HasPrefix(status, "init source "):
		msg = fmt.Sprintf("sourcing %s failed with status %s", file, strings.TrimPrefix(status, "init source "))
	case status == "init nofunc":
		msg = fmt.Sprintf("%s does not define a function %q", file, fn)
	default:
		msg = fmt.Sprintf("bash exited with status %d while sourcing %s", in.proc.ExitCode(), file)
	}
	if t := in.initTail.String(); t != "" {
		msg += ": " + t
	}
	return nil, errors.New(bounds.Truncate(strings.ToValidUTF8(msg, "\uFFFD"), bounds.Message))
}
