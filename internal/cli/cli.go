// Package cli is what each `stoke` client command does, over
// internal/client: run a task and follow it to its exit code, run a
// function until it is Ready, apply manifests, get, describe, follow logs,
// invoke, cancel and delete. cmd/stoke only parses flags and calls these.
//
// A command writes its results to Streams.Out and its notes to
// Streams.Err (each note starts with "stoke: "), and returns an error
// whose message is one line. A command that must end with a particular
// exit status (a task's exit code, 130 after Ctrl-C) returns an
// *ExitError.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/errdefs"
)

// Exit statuses besides a task's own.
const (
	// ExitFailed is a Run that failed without an exit code of its own.
	ExitFailed = 1
	// ExitTimeout is a Run that ran out of time, as timeout(1) reports it.
	ExitTimeout = 124
	// ExitInterrupted follows Ctrl-C (SIGINT) or SIGTERM: 128 + SIGINT.
	ExitInterrupted = 130
)

// Streams are a command's standard streams.
type Streams struct {
	In       io.Reader
	Out, Err io.Writer
}

// note writes one "stoke: " line to Err.
func (s Streams) note(format string, args ...any) {
	fmt.Fprintf(s.Err, "stoke: "+format+"\n", args...)
}

// ExitError ends a command with Code; Err, when not nil, is printed first.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

func (e *ExitError) Unwrap() error { return e.Err }

// ExitCode is the status the process should exit with.
func (e *ExitError) ExitCode() int { return e.Code }

// interrupted is the error of a command stopped by Ctrl-C.
func interrupted() error { return &ExitError{Code: ExitInterrupted} }

// cleanupTimeout bounds the calls a command makes after Ctrl-C (cancel a
// Run it started).
const cleanupTimeout = 10 * time.Second

// Hint is HintFor a standalone server.
func Hint(err error) error { return HintFor(client.Target{Mode: client.Standalone}, err) }

// HintFor makes err a one-line message for a person: the lines of a
// joined error become one, and a backend that cannot be reached or that
// refused the credentials gets a hint that fits its mode — for a
// standalone server, to start one or where tokens come from; for a
// cluster, which kubeconfig context was used.
func HintFor(t client.Target, err error) error {
	if err == nil {
		return nil
	}
	var ee *ExitError
	if errors.As(err, &ee) && ee.Err == nil {
		return err
	}
	msg := strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "; ")
	var unreachable *client.UnreachableError
	switch {
	case t.Mode == client.Cluster && (errors.Is(err, errdefs.ErrUnavailable) || errors.Is(err, errdefs.ErrUnauthenticated) || errors.Is(err, errdefs.ErrPermissionDenied)):
		msg += fmt.Sprintf(" (cluster: kubeconfig context %q, API server %s; chosen by %s)", t.Context, t.Server, t.Why)
	case errors.As(err, &unreachable):
		msg += `; is "stoke up" running? (--server or ` + client.EnvServer + ` name another server)`
	case errors.Is(err, errdefs.ErrUnauthenticated) && !strings.Contains(msg, "--token"):
		msg += "; the server refused the API token (pass --token or set " + client.EnvToken + "; a local server's token is in <data-dir>/token)"
	}
	if msg == err.Error() {
		return err
	}
	return &hinted{msg: msg, err: err}
}

type hinted struct {
	msg string
	err error
}

func (h *hinted) Error() string { return h.msg }
func (h *hinted) Unwrap() error { return h.err }

// Ref is "kind/name" of a Run.
func Ref(run *v1alpha1.Run) string { return "run/" + run.Name }

// namespaceFlag renders " -n NS" for a hint when ns is not the default.
func namespaceFlag(ns string) string {
	if ns == "" || ns == client.DefaultNamespace {
		return ""
	}
	return " -n " + ns
}

// firstLine is s up to its first newline, marked when shortened.
func firstLine(s string) string {
	line, rest, _ := strings.Cut(strings.TrimSpace(s), "\n")
	if rest != "" {
		return line + " …"
	}
	return line
}

// waitRun returns the Run ns/name (with UID uid, when not empty) as soon as
// done holds for it: now, or after a later change seen through a watch
// started from the version it was read at. A Run that is deleted first
// is an error wrapping errdefs.ErrNotFound.
func waitRun(ctx context.Context, c client.API, ns, name, uid string, done func(*v1alpha1.Run) bool) (*v1alpha1.Run, error) {
	run, err := c.GetRun(ctx, ns, name)
	if err != nil {
		return nil, err
	}
	if uid != "" && string(run.UID) != uid {
		return nil, errdefs.Errorf(errdefs.ErrNotFound, "run %s/%s was deleted and created again", ns, name)
	}
	if done(run) {
		return run, nil
	}
	w, err := c.WatchRuns(ctx, ns, client.ListOptions{ResourceVersion: run.ResourceVersion})
	if errors.Is(err, errdefs.ErrExpired) {
		// Too old to replay already: start from the current state, which
		// the stream begins with.
		w, err = c.WatchRuns(ctx, ns, client.ListOptions{})
	}
	if err != nil {
		return nil, err
	}
	defer w.Close()
	uid = string(run.UID)
	for {
		ev, err := w.Next()
		if errors.Is(err, io.EOF) {
			return nil, errdefs.Errorf(errdefs.ErrUnavailable, "watching run %s/%s: the server closed the stream", ns, name)
		}
		if err != nil {
			return nil, err
		}
		if ev.Object.Name != name || string(ev.Object.UID) != uid {
			continue
		}
		if ev.Type == client.Deleted {
			return ev.Object, errdefs.Errorf(errdefs.ErrNotFound, "run %s/%s was deleted", ns, name)
		}
		if done(ev.Object) {
			return ev.Object, nil
		}
	}
}

// terminal reports whether a Run can no longer change phase.
func terminal(run *v1alpha1.Run) bool { return run.Status.Phase.Terminal() }
