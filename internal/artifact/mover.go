package artifact

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/podcopy"
)

// ExecRouter finds the exec hop of a live Run and its ID there: the
// shape of gateway.ExecRouter, which standalone implements; ThroughGateway
// is the one for a process that reaches Runs through a gateway.
type ExecRouter interface {
	ExecRoute(namespace, name string) (exec.Executor, string, error)
}

// Target is the live Run a copy goes through: a task on the job's pod
// whose working directory is the job's workspace, running HoldCommand.
type Target struct {
	Namespace, Name string
}

// Mover copies artifacts between a job's workspace and the Store. The
// workflow engine, for a `uses: upload-artifact` or `download-artifact`
// step:
//
//  1. creates the step's Run on the job's pod, in its workspace, with
//     HoldCommand as its task (args, no entrypoint);
//  2. once it runs, calls Upload or Download with it as the Target;
//  3. calls Release with the outcome: the hold ends with exit 0 when the
//     copy succeeded and 1 when not, so the step Run ends Succeeded or
//     Failed like any step, and the engine puts the error's text in the
//     step's message.
type Mover struct {
	store *Store
	exec  ExecRouter
}

// NewMover returns a Mover between store and the Runs exec reaches.
func NewMover(store *Store, exec ExecRouter) *Mover { return &Mover{store: store, exec: exec} }

// Store is the Mover's store.
func (m *Mover) Store() *Store { return m.store }

// holdScript waits until Release signals it: USR1 ends it with 0, USR2
// with 1. The sleep in the background keeps the shell able to take the
// signal at once; it goes with the task's process group.
const holdScript = `trap 'exit 0' USR1; trap 'exit 1' USR2; while :; do sleep 3600 & wait $!; done`

// HoldCommand is the argv of an artifact step's Run: it holds the job's
// workspace open for the copy until Release ends it. Its step's timeout
// bounds it like any step's.
func HoldCommand() []string { return []string{"sh", "-c", holdScript, "stoke-artifact-step"} }

// releaseScript signals the hold (the task's own process, whose PID exec
// gives every session into a running task).
const releaseScript = `exec kill -s "$1" -- "$` + exec.TaskPIDEnv + `"`

// Release ends the hold of t: exit 0 when ok, 1 when not. A Run that has
// ended already (its timeout, a cancel) is no error: the engine reads its
// phase.
func (m *Mover) Release(ctx context.Context, t Target, ok bool) error {
	pt, err := m.target(t)
	if err != nil {
		return err
	}
	sig := "USR2"
	if ok {
		sig = "USR1"
	}
	err = podcopy.Script(ctx, pt, releaseScript, []string{sig}, nil, io.Discard)
	if errors.Is(err, errdefs.ErrNotRunning) || errors.Is(err, errdefs.ErrFailedPrecondition) {
		// The hold ended at the signal and took the session with it:
		// what was asked.
		return nil
	}
	return err
}

func (m *Mover) target(t Target) (podcopy.Target, error) {
	x, uid, err := m.exec.ExecRoute(t.Namespace, t.Name)
	if err != nil {
		return podcopy.Target{}, err
	}
	return podcopy.Target{Exec: x, RunUID: uid, Name: "run " + t.Namespace + "/" + t.Name}, nil
}

// IfNoFilesFound is what an upload that matches no file does, as GitHub's
// upload-artifact's input of that name says.
type IfNoFilesFound string

const (
	// NoFilesWarn succeeds with a warning and stores nothing (default).
	NoFilesWarn IfNoFilesFound = "warn"
	// NoFilesError fails the step.
	NoFilesError IfNoFilesFound = "error"
	// NoFilesIgnore succeeds silently and stores nothing.
	NoFilesIgnore IfNoFilesFound = "ignore"
)

// Upload is an upload-artifact step's inputs.
type Upload struct {
	// Name is the artifact's name (with: name; default "artifact", as
	// GitHub's).
	Name string
	// Paths are the lines of with: path, relative to the workspace:
	// files, directories and globs (*, ?, [...] within a name and ** for
	// any depth of directories). Names starting with '.' are matched by
	// a glob only when it says so; a directory brings all it holds.
	// Absolute paths, '..' and exclusions ('!') are refused.
	Paths []string
	// IfNoFilesFound is with: if-no-files-found (default warn).
	IfNoFilesFound IfNoFilesFound
}

// Download is a download-artifact step's inputs.
type Download struct {
	// Name is with: name, the artifact to restore (required: Stoke does
	// not restore all of a run's artifacts at once).
	Name string
	// Path is with: path, the directory (relative to the workspace) the
	// files go into; "" is the workspace. It is made when missing.
	Path string
}

// ParseUpload reads an upload-artifact step's with: values, after the
// engine has evaluated their expressions. Unknown keys are refused.
func ParseUpload(with map[string]string) (Upload, error) {
	u := Upload{Name: "artifact", IfNoFilesFound: NoFilesWarn}
	for k, v := range with {
		switch k {
		case "name":
			u.Name = v
		case "path":
			for line := range strings.SplitSeq(v, "\n") {
				if line = strings.TrimSpace(line); line != "" {
					u.Paths = append(u.Paths, line)
				}
			}
		case "if-no-files-found":
			u.IfNoFilesFound = IfNoFilesFound(v)
		default:
			return Upload{}, errdefs.InvalidArgument("with."+k, "upload-artifact takes name, path and if-no-files-found")
		}
	}
	return u, u.validate()
}

func (u Upload) validate() error {
	if err := ValidName(u.Name); err != nil {
		return err
	}
	switch u.IfNoFilesFound {
	case NoFilesWarn, NoFilesError, NoFilesIgnore:
	default:
		return errdefs.InvalidArgument("with.if-no-files-found", "%q: one of warn, error, ignore", bounds.Truncate(string(u.IfNoFilesFound), bounds.Quoted))
	}
	if len(u.Paths) == 0 {
		return errdefs.InvalidArgument("with.path", "upload-artifact needs a path")
	}
	if len(u.Paths) > bounds.ArtifactPaths {
		return errdefs.InvalidArgument("with.path", "%d lines, at most %d allowed", len(u.Paths), bounds.ArtifactPaths)
	}
	for _, p := range u.Paths {
		if strings.HasPrefix(p, "!") {
			return errdefs.InvalidArgument("with.path", "%q: exclusions ('!') are not supported", bounds.Truncate(p, bounds.Quoted))
		}
		if err := podcopy.CheckPath("with.path", strings.TrimSuffix(p, "/")); err != nil {
			return err
		}
	}
	return nil
}

// ParseDownload reads a download-artifact step's with: values.
func ParseDownload(with map[string]string) (Download, error) {
	var d Download
	for k, v := range with {
		switch k {
		case "name":
			d.Name = v
		case "path":
			d.Path = strings.TrimSpace(v)
		default:
			return Download{}, errdefs.InvalidArgument("with."+k, "download-artifact takes name and path")
		}
	}
	return d, d.validate()
}

func (d Download) validate() error {
	if err := ValidName(d.Name); err != nil {
		return err
	}
	if d.Path != "" && d.Path != "." {
		return podcopy.CheckPath("with.path", strings.TrimSuffix(d.Path, "/"))
	}
	return nil
}

// hasGlob reports whether a path element is a pattern.
func hasGlob(s string) bool { return strings.ContainsAny(s, "*?[") }

// searchPath is the part of a pattern before its first glob element, as
// GitHub's @actions/glob computes it ("." when it starts with one).
func searchPath(p string) string {
	var keep []string
	for el := range strings.SplitSeq(path.Clean(p), "/") {
		if hasGlob(el) {
			break
		}
		keep = append(keep, el)
	}
	if len(keep) == 0 {
		return "."
	}
	return path.Join(keep...)
}

// uploadRoot is the directory an artifact's names are relative to, as
// GitHub's upload-artifact makes it: the least common ancestor of the
// patterns' search paths (a single path's is itself; uploadScript moves
// up to the parent when that names a file).
func uploadRoot(patterns []string) string {
	root := searchPath(patterns[0])
	for _, p := range patterns[1:] {
		root = commonDir(root, searchPath(p))
	}
	return root
}

func commonDir(a, b string) string {
	as, bs := strings.Split(a, "/"), strings.Split(b, "/")
	n := 0
	for n < len(as) && n < len(bs) && as[n] == bs[n] {
		n++
	}
	if n == 0 {
		return "."
	}
	return path.Join(as[:n]...)
}

// uploadScript runs in the Run, in the workspace ($PWD), with the root as
// $1 and the patterns after it: it expands the patterns (bash globs with
// ** as any depth; no word splitting), refuses a match that resolves
// outside the workspace, and writes a tar of the matches (each once),
// named relative to the root, links followed as GitHub's upload does (no
// links in the tar, hard or symbolic). No match: exit 7.
const uploadScript = podcopy.ResolveScript + `ws=$PWD root=$1; shift
[ -d "$p" ] || root=$(dirname -- "$root")
shopt -s globstar nullglob; IFS=
names=(); declare -A seen
for pat in "$@"; do
  for m in $pat; do
    [ -e "$m" ] || continue
    r=$(realpath -e -- "$m") || continue
    case "$r/" in "$ws"/*) ;; *) echo "$m resolves outside the working directory" >&2; exit 5;; esac
    m=${m%/}
    if [ "$m" = "$root" ]; then n=.; elif [ "$root" = . ]; then n=$m; else n=${m#"$root"/}; fi
    [ -z "${seen[$n]}" ] || continue
    seen[$n]=1; names+=("$n")
  done
done
[ ${#names[@]} -gt 0 ] || exit 7
cd -- "$root" && printf '%s\0' "${names[@]}" | exec tar -c --dereference --hard-dereference --null -T - -f -`

// downloadScript makes the directory $1 (resolved inside the workspace,
// links followed) and extracts the tar on stdin into it.
const downloadScript = `p=$(realpath -m -- "$1") || exit 4
case "$p/" in "$PWD"/*) ;; *) echo "$1 resolves outside the working directory" >&2; exit 5;; esac
mkdir -p -- "$p" && cd -- "$p" && exec tar -x --no-same-owner --no-same-permissions -f -`

// Upload stores the files of t's workspace that u names as the artifact
// u.Name of run. When they match no file it stores nothing and returns
// the zero Artifact with a warning (warn), nothing (ignore) or a NotFound
// error (error). Errors carry the run and the artifact;
// bad inputs are InvalidArgument, bounds TooLarge, a name written before
// AlreadyExists.
func (m *Mover) Upload(ctx context.Context, run Run, t Target, u Upload) (_ Artifact, warning string, _ error) {
	if err := u.validate(); err != nil {
		return Artifact{}, "", fmt.Errorf("workflowrun %s: upload-artifact: %w", run, err)
	}
	pt, err := m.target(t)
	if err != nil {
		return Artifact{}, "", err
	}
	root := uploadRoot(u.Paths)
	args := append([]string{root}, u.Paths...)
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := podcopy.BashScript(ctx, pt, uploadScript, args, nil, pw)
		pw.CloseWithError(err)
		done <- err
	}()
	a, err := m.store.Put(ctx, run, u.Name, pr)
	pr.CloseWithError(errors.New("the upload ended"))
	serr := <-done
	var exit *podcopy.ExitError
	if serr != nil && (err == nil || errors.As(serr, &exit)) {
		// The script's own end (no files, a path outside) says more
		// than the store's read of a stream it cut; a store refusal
		// (a bound, a name) says more than the cut stream.
		err = serr
	}
	if err == nil {
		return a, "", nil
	}
	if noFiles(err) {
		// Put saw an empty stream end with the script's error: nothing
		// stored.
		msg := fmt.Sprintf("no files were found with the provided path: %s. No artifacts will be uploaded.", strings.Join(u.Paths, ", "))
		switch u.IfNoFilesFound {
		case NoFilesError:
			return Artifact{}, "", errdefs.Errorf(errdefs.ErrNotFound, "workflowrun %s: upload-artifact %s: no files were found with the provided path: %s", run, u.Name, strings.Join(u.Paths, ", "))
		case NoFilesWarn:
			return Artifact{}, msg, nil
		}
		return Artifact{}, "", nil
	}
	return Artifact{}, "", fmt.Errorf("workflowrun %s: upload-artifact %s: %w", run, u.Name, err)
}

// noFiles reports whether the upload script said exit 7 (or found no
// root: exit 4).
func noFiles(err error) bool {
	var ex *podcopy.ExitError
	return errors.As(err, &ex) && (ex.Code == 7 || ex.Code == 4)
}

// Download restores the artifact d.Name of run into t's workspace, under
// d.Path. Every entry is checked again on the way in (podcopy.PutScript);
// nothing is written outside the directory.
func (m *Mover) Download(ctx context.Context, run Run, t Target, d Download) (Artifact, error) {
	if err := d.validate(); err != nil {
		return Artifact{}, fmt.Errorf("workflowrun %s: download-artifact: %w", run, err)
	}
	a, rc, err := m.store.Get(ctx, run, d.Name)
	if err != nil {
		return Artifact{}, err
	}
	defer rc.Close()
	pt, err := m.target(t)
	if err != nil {
		return Artifact{}, err
	}
	dir := d.Path
	if dir == "" {
		dir = "."
	}
	if err := podcopy.PutScript(ctx, pt, downloadScript, []string{dir}, rc, a.Size); err != nil {
		return Artifact{}, fmt.Errorf("workflowrun %s: download-artifact %s: %w", run, d.Name, err)
	}
	return a, nil
}

// Step carries out one artifact step through t, the step's Run running
// HoldCommand: it reads with: (ParseUpload or ParseDownload), copies, and
// releases t with the outcome, so the Run ends Succeeded or Failed as the
// copy did. message says what was copied, or the upload's warning.
func (m *Mover) Step(ctx context.Context, upload bool, with map[string]string, run Run, t Target) (message string, err error) {
	if upload {
		var u Upload
		if u, err = ParseUpload(with); err == nil {
			var a Artifact
			a, message, err = m.Upload(ctx, run, t, u)
			if err == nil && message == "" && a.Digest != "" {
				message = fmt.Sprintf("uploaded %s: %d files, %d bytes, %s", a.Name, a.Files, a.Size, a.Digest)
			}
		}
	} else {
		var d Download
		if d, err = ParseDownload(with); err == nil {
			var a Artifact
			if a, err = m.Download(ctx, run, t, d); err == nil {
				message = fmt.Sprintf("downloaded %s: %d files, %d bytes", a.Name, a.Files, a.Size)
			}
		}
	}
	if rerr := m.Release(ctx, t, err == nil); rerr != nil && err == nil {
		err = fmt.Errorf("releasing the step's run %s/%s: %w", t.Namespace, t.Name, rerr)
	}
	return message, err
}

// ThroughGateway is the ExecRouter of a process that reaches Runs through
// a gateway's exec route (internal/client's Executor, which names a Run
// "namespace/name"): `stoke controller`, whose copies go through the
// gateway as the Kubernetes aggregated API with its own identity.
func ThroughGateway(x exec.Executor) ExecRouter { return gatewayRouter{x} }

type gatewayRouter struct{ x exec.Executor }

func (g gatewayRouter) ExecRoute(namespace, name string) (exec.Executor, string, error) {
	return g.x, namespace + "/" + name, nil
}
