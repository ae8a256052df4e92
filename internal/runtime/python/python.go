// Package python is Stoke's warm Python adapter. Each function registration
// gets one long-lived worker process (python3 running the embedded
// worker.py, in its own process group, in the registration's working
// directory and environment) that imports the handler's module once and then
// serves one invocation at a time.
//
// The worker speaks a small binary protocol over two dedicated pipes, so that
// whatever the handler prints can never corrupt a result: the worker reads
// requests from fd 3 and writes responses to fd 4, while its stdout and
// stderr are read by goroutines and logged line by line (with run_uid and the
// invocation_id of the invocation they were written during). All integers are
// little-endian.
//
//	request  (Go → fd 3): u32 len(invocation_id) | u32 len(scope) |
//	                      u32 len(input) | u64 remaining ns |
//	                      invocation_id | scope | input (JSON)
//	response (fd 4 → Go): u32 len(payload) | u8 kind | payload
//
//	kind 3 READY       payload: the Python version; sent once after the import
//	kind 4 INIT_ERROR  payload: type | message | traceback; the worker exits
//	kind 1 OK          payload: u32 len(output) | output (JSON) |
//	                   { u32 len(key) | u32 len(value) | key | value }*
//	kind 2 ERROR       payload: type | message | traceback
//	kind 5 HANDED      a spare's, empty: it took its registration (spare.go)
//	kind 6 SPARE       a spare's, empty: started, waiting for one
//	kind 7 REFUSED     a spare's, payload: why it cannot take that one
//
// where each string is u32 length | UTF-8 bytes. The worker flushes the
// handler's stdout and stderr before it writes a response, and the adapter
// files what is still in those pipes under the finishing invocation before
// Invoke returns (see logStream); output written between invocations or
// during the import is filed under no invocation.
//
// The worker runs as `python3 -s -c <worker.py> ...`: the interpreter's
// site-packages (with their .pth files) are importable and PYTHON* variables
// of the registration's env such as PYTHONPATH apply, but the user site is
// not (HOME is the working directory); the working directory comes first on
// sys.path. A handler that accepts two positional arguments is called with
// (event, context), one that accepts one with (event); `async def` handlers
// run on one event loop kept by the worker.
//
// A request's scope is the invocation's proc.ScopeEnv, which the worker
// sets in its environment before the handler runs (empty: left as it is).
// With a scope, every child of the worker that was not there before the
// call is killed when it returns (proc.KillChildrenExcept): a child is
// known by its pid and start time, not by its environment, which a child
// that forked without exec has from the worker.
//
// A worker that exits, or a request whose context ends, ends the instance:
// the adapter kills the worker's process group and closes Done, and the core
// loads a replacement.
package python

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"stoke.dev/stoke/internal/proc"
	"stoke.dev/stoke/internal/pydeps"
	"stoke.dev/stoke/internal/runtime"
)

//go:embed worker.py
var workerSource string

// Config configures the adapter.
type Config struct {
	// Interpreter is the python3 executable, resolved once at start-up with
	// ResolveInterpreter so that no version-manager shim runs per Load.
	// Empty means "python3" on the server's PATH.
	Interpreter string
	// Deps, when set, installs what a source's requirements.txt lists
	// (once per digest, shared by the Runtime's servers) and the handler
	// or task imports from it: its directory leads PYTHONPATH (or, for a
	// registration handed to the spare, takes the place on sys.path that
	// PYTHONPATH would have given it: spare.go). Nil: a requirements.txt
	// is a file like any other.
	Deps *pydeps.Cache
	// Spare keeps one worker started ahead once KeepSpare is called (a
	// Runtime Server's Functions do), handed to the next registration
	// that fits (spare.go): its interpreter's start leaves the path.
	Spare bool
}

// Adapter runs Python handlers in warm worker processes.
type Adapter struct {
	interpreter string
	deps        *pydeps.Cache
	spareOn     bool
	spares      spares
}

var (
	_ runtime.Adapter      = (*Adapter)(nil)
	_ runtime.TaskPreparer = (*Adapter)(nil)
	_ runtime.SpareKeeper  = (*Adapter)(nil)
)

// New returns a Python adapter.
func New(cfg Config) *Adapter {
	if cfg.Interpreter == "" {
		cfg.Interpreter = "python3"
	}
	a := &Adapter{interpreter: cfg.Interpreter, deps: cfg.Deps, spareOn: cfg.Spare}
	a.spares.a = a
	return a
}

// useDeps returns the directory of the dependencies that the
// requirements.txt in dir lists, installing them first if the cache has
// not; "" without Deps or requirements. The directory is held in use
// (kept from the cache's pruning) until release, which is never nil, is
// called.
func (a *Adapter) useDeps(ctx context.Context, dir string) (deps string, release func(), _ error) {
	if a.deps == nil {
		return "", func() {}, nil
	}
	return a.deps.Use(ctx, dir)
}

// pathFirst returns env with dir leading PYTHONPATH.
func pathFirst(env []string, dir string) []string {
	out := make([]string, 0, len(env)+1)
	path := dir
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PYTHONPATH="); ok {
			if v != "" {
				path = dir + string(os.PathListSeparator) + v
			}
			continue
		}
		out = append(out, kv)
	}
	return append(out, "PYTHONPATH="+path)
}

// TaskNeedsPrepare: a task whose source has a requirements.txt, with
// Deps (runtime.TaskPreparer).
func (a *Adapter) TaskNeedsPrepare(dir string) bool {
	if a.deps == nil {
		return false
	}
	_, err := os.Lstat(filepath.Join(dir, pydeps.File))
	return err == nil
}

// PrepareTask installs the task's requirements and returns its env with
// them on PYTHONPATH (runtime.TaskPreparer).
func (a *Adapter) PrepareTask(ctx context.Context, dir string, env []string) ([]string, error) {
	// Not held: the cache keeps a directory for the longest task's time
	// after its last use.
	deps, release, err := a.useDeps(ctx, dir)
	release()
	if err != nil || deps == "" {
		return env, err
	}
	return pathFirst(env, deps), nil
}

// Name is "python".
func (a *Adapter) Name() string { return "python" }

// pythonKeywords are the hard keywords of Python 3: a module or function
// with one of these names cannot be imported or referenced.
var pythonKeywords = map[string]bool{
	"False": true, "None": true, "True": true, "and": true, "as": true,
	"assert": true, "async": true, "await": true, "break": true,
	"class": true, "continue": true, "def": true, "del": true, "elif": true,
	"else": true, "except": true, "finally": true, "for": true, "from": true,
	"global": true, "if": true, "import": true, "in": true, "is": true,
	"lambda": true, "nonlocal": true, "not": true, "or": true, "pass": true,
	"raise": true, "return": true, "try": true, "while": true, "with": true,
	"yield": true,
}

// ValidateHandler checks "module.function" or "pkg.module.function": at
// least two dot-separated parts, each an ASCII Python identifier that is not
// a keyword. The last part names the function, the rest the module.
func (a *Adapter) ValidateHandler(h string) error {
	parts := strings.Split(h, ".")
	if len(parts) < 2 {
		return fmt.Errorf("%q: want module.function, e.g. handler.handle or pkg.module.handle", h)
	}
	for _, p := range parts {
		switch {
		case p == "":
			return fmt.Errorf("%q has an empty name between dots", h)
		case !isIdentifier(p):
			return fmt.Errorf("%q is not a Python identifier ([A-Za-z_][A-Za-z0-9_]*)", p)
		case pythonKeywords[p]:
			return fmt.Errorf("%q is a Python keyword", p)
		}
	}
	return nil
}

func isIdentifier(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (i > 0 && c >= '0' && c <= '9')
		if !ok {
			return false
		}
	}
	return s != ""
}

// TaskCommand returns [interpreter, entrypoint, args...], or
// [interpreter, args...] without an entrypoint (e.g. args "-m", "pkg").
func (a *Adapter) TaskCommand(entrypoint string, args []string, _ time.Duration) ([]string, error) {
	if entrypoint == "" && len(args) == 0 {
		return nil, errors.New("python task needs an entrypoint or arguments")
	}
	argv := make([]string, 0, 2+len(args))
	argv = append(argv, a.interpreter)
	if entrypoint != "" {
		argv = append(argv, entrypoint)
	}
	return append(argv, args...), nil
}

// ResolveInterpreter asks python (default "python3" on PATH) for its real
// executable, sys.executable. Call it once at start-up: a version-manager
// shim such as pyenv's costs a fraction of a second per start, which must
// not be paid by every Load. Symbolic links are kept, so that a virtualenv's
// interpreter stays in its virtualenv.
func ResolveInterpreter(ctx context.Context, python string) (string, error) {
	if python == "" {
		python = "python3"
	}
	// The server's own environment on purpose: shims find their
	// configuration through it.
	cmd := exec.Command(python, "-c", "import sys; print(sys.executable)")
	var stdout, stderr cappedBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := proc.Run(ctx, cmd, 0); err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("resolve python interpreter %q: %w", python, ctx.Err())
		}
		if msg := bytes.TrimSpace(stderr.buf.Bytes()); len(msg) > 0 {
			return "", fmt.Errorf("resolve python interpreter %q: %w: %s", python, err, msg)
		}
		return "", fmt.Errorf("resolve python interpreter %q: %w", python, err)
	}
	exe := strings.TrimSpace(stdout.buf.String())
	if exe == "" || !filepath.IsAbs(exe) {
		return "", fmt.Errorf("resolve python interpreter %q: sys.executable is %q, not an absolute path", python, exe)
	}
	if fi, err := os.Stat(exe); err != nil || fi.IsDir() {
		return "", fmt.Errorf("resolve python interpreter %q: sys.executable %s is not a file", python, exe)
	}
	return exe, nil
}

// cappedBuffer keeps the first 4 KiB written to it and discards the rest,
// so a misbehaving interpreter cannot grow it without bound.
type cappedBuffer struct{ buf bytes.Buffer }

func (c *cappedBuffer) Write(p []byte) (int, error) {
	if room := 4<<10 - c.buf.Len(); room > 0 {
		c.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}
