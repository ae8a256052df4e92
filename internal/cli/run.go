package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/runlog"
)

// RunOptions tune `stoke run`.
type RunOptions struct {
	// Detach prints the new Run's name and returns without waiting.
	Detach bool
	// Remove deletes a task Run once it finished and its result is read,
	// or after Ctrl-C has cancelled it.
	Remove bool
	// Quiet leaves out notes (retries, outputs, hints) on Err.
	Quiet bool
	// Stdin (-i) gives a task the CLI's stdin, TTY (-t) a terminal, as
	// `docker run -i/-t` (runattach.go).
	Stdin, TTY bool
}

// createRun creates run. With opts.Detach it prints the Run's name and
// returns no Run: the caller is done.
func createRun(ctx context.Context, c client.API, run *v1alpha1.Run, opts RunOptions, s Streams) (*v1alpha1.Run, error) {
	created, err := c.CreateRun(ctx, run)
	if ctx.Err() != nil {
		return nil, interrupted()
	}
	if err != nil {
		return nil, fmt.Errorf("creating the run: %w", err)
	}
	if opts.Detach {
		fmt.Fprintln(s.Out, created.Name)
		return nil, nil
	}
	return created, nil
}

// RunTask creates a task Run, copies its output to s (stdout records to
// Out, stderr records to Err) until it is terminal, and returns nil when
// it succeeded or an *ExitError with its exit status: the task's own exit
// code, ExitTimeout, or ExitFailed with a message. Ctrl-C (ctx ending)
// asks the server to cancel the Run (and, with opts.Remove, deletes it)
// and returns ExitInterrupted.
func RunTask(ctx context.Context, c client.API, run *v1alpha1.Run, opts RunOptions, s Streams) error {
	interactive(run, &opts, s)
	created, err := createRun(ctx, c, run, opts, s)
	if created == nil || err != nil {
		return err
	}
	ns, name := created.Namespace, created.Name
	var final *v1alpha1.Run
	if opts.Stdin || opts.TTY {
		final, err = attachTask(ctx, c, created, opts, s)
	} else {
		final, err = followTask(ctx, c, created, opts, s)
	}
	if ctx.Err() != nil {
		cancelAfterInterrupt(ctx, c, created, opts.Remove, s)
		return interrupted()
	}
	if err != nil {
		return fmt.Errorf("run %s/%s: %w", ns, name, err)
	}
	if len(final.Status.Outputs) > 0 && !opts.Quiet {
		for _, k := range slices.Sorted(maps.Keys(final.Status.Outputs)) {
			s.note("output %s=%s", k, final.Status.Outputs[k])
		}
	}
	if opts.Remove {
		if _, err := c.DeleteRun(ctx, ns, name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			s.note("deleting run %s/%s: %v", ns, name, err)
		}
	}
	return TaskResult(final)
}

// followTask streams the Run's log to s and returns the Run once terminal.
func followTask(ctx context.Context, c client.API, run *v1alpha1.Run, opts RunOptions, s Streams) (*v1alpha1.Run, error) {
	ns, name := run.Namespace, run.Name
	var attempt int32
	// The gateway finds a Run its informer has not seen yet (the
	// caller has just created it) by asking the API server.
	logs, err := c.Logs(ctx, ns, name, true)
	if err != nil {
		return nil, fmt.Errorf("following the log: %w", err)
	}
	defer logs.Close()
	for {
		rec, err := logs.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("following the log: %w", err)
		}
		if rec.Attempt > attempt {
			if attempt > 0 && !opts.Quiet {
				s.note("retrying %s: attempt %d", Ref(run), rec.Attempt)
			}
			attempt = rec.Attempt
		}
		writeRecord(rec, s, false)
	}
	// The log ends when the Run is terminal; the Run says how it ended.
	return waitRun(ctx, c, ns, name, string(run.UID), terminal)
}

// writeRecord copies one log record to s: stdout to Out, stderr to Err,
// a truncation note to Err. An exit record prints nothing.
func writeRecord(rec runlog.Record, s Streams, timestamps bool) {
	prefix := ""
	if timestamps && !rec.Time.IsZero() {
		prefix = rec.Time.UTC().Format("2006-01-02T15:04:05.000Z07:00") + " "
	}
	switch rec.Stream {
	case runlog.StreamStdout:
		fmt.Fprintf(s.Out, "%s%s\n", prefix, rec.Line)
	case runlog.StreamStderr:
		fmt.Fprintf(s.Err, "%s%s\n", prefix, rec.Line)
	case runlog.StreamTruncated:
		s.note("the log reached its size limit (%d MiB); later output was dropped", runlog.MaxBytes>>20)
	}
}

// TaskResult turns a terminal task Run into the command's result: nil for
// Succeeded; the task's exit code (silently, as `docker run` does) for a
// non-zero exit; ExitTimeout or ExitFailed with a one-line message
// otherwise.
func TaskResult(run *v1alpha1.Run) error {
	st := &run.Status
	if st.Phase == v1alpha1.PhaseSucceeded {
		return nil
	}
	if st.Phase == v1alpha1.PhaseFailed && st.ExitCode != nil && *st.ExitCode > 0 && *st.ExitCode < 256 {
		return &ExitError{Code: int(*st.ExitCode)}
	}
	code := ExitFailed
	if st.Phase == v1alpha1.PhaseTimeout {
		code = ExitTimeout
	}
	return &ExitError{Code: code, Err: errors.New(endState(run))}
}

// endState says in one line how a Run ended: "run NAME Timeout
// (IdleTimeout): message".
func endState(run *v1alpha1.Run) string {
	st := &run.Status
	msg := fmt.Sprintf("%s %s", Ref(run), st.Phase)
	if st.Reason != "" && st.Reason != string(st.Phase) {
		msg += " (" + st.Reason + ")"
	}
	if st.ExitCode != nil {
		msg += fmt.Sprintf(", exit code %d", *st.ExitCode)
	}
	if st.Message != "" {
		msg += ": " + firstLine(st.Message)
	}
	return msg
}

// cancelAfterInterrupt asks the server to cancel a Run this command
// started, and with remove then deletes it, with a context of its own
// since ctx has ended.
func cancelAfterInterrupt(ctx context.Context, c client.API, run *v1alpha1.Run, remove bool, s Streams) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if _, err := c.CancelRun(cctx, run.Namespace, run.Name); err != nil {
		s.note("interrupted; cancelling %s failed: %v", Ref(run), HintFor(c.Target(), err))
		return
	}
	if !remove {
		s.note("interrupted; cancelled %s", Ref(run))
		return
	}
	if _, err := c.DeleteRun(cctx, run.Namespace, run.Name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		s.note("interrupted; cancelled %s, deleting it failed: %v", Ref(run), HintFor(c.Target(), err))
		return
	}
	s.note("interrupted; cancelled and deleted %s", Ref(run))
}

// RunFunction creates a function Run and waits until it is Ready, then
// prints its invoke URL to Out (and, unless quiet, how to call it to Err).
// A Run that ends before it is Ready is an ExitFailed error naming why
// (the whole message, e.g. a traceback, goes to Err first). Ctrl-C before
// Ready cancels the Run.
func RunFunction(ctx context.Context, c client.API, run *v1alpha1.Run, opts RunOptions, s Streams) error {
	created, err := createRun(ctx, c, run, opts, s)
	if created == nil || err != nil {
		return err
	}
	ready, err := waitRun(ctx, c, created.Namespace, created.Name, string(created.UID), func(r *v1alpha1.Run) bool {
		return terminal(r) || (r.Status.Phase == v1alpha1.PhaseReady && r.Status.Endpoint != "")
	})
	if ctx.Err() != nil {
		cancelAfterInterrupt(ctx, c, created, false, s)
		return interrupted()
	}
	if err != nil {
		return fmt.Errorf("waiting for %s to be Ready: %w", Ref(created), err)
	}
	if terminal(ready) {
		if m := ready.Status.Message; strings.Contains(strings.TrimSpace(m), "\n") {
			fmt.Fprintln(s.Err, strings.TrimRight(m, "\n"))
		}
		return &ExitError{Code: ExitFailed, Err: errors.New(endState(ready))}
	}
	endpoint := c.InvokeURL(ready)
	fmt.Fprintln(s.Out, endpoint)
	if !opts.Quiet {
		// Stoke knows nothing of the input a handler expects, so the hint
		// shows none: both send {}, and -d gives the function its own.
		s.note("%s is Ready; invoke it with (-d JSON for an input other than {})", Ref(ready))
		fmt.Fprintf(s.Err, "  stoke invoke %s%s\n", ready.Name, namespaceFlag(ready.Namespace))
		if c.Target().Mode == client.Standalone {
			// On a cluster the URL is the API server's proxy, which takes
			// the kubeconfig's credentials, not a token of Stoke's.
			fmt.Fprintf(s.Err, "  curl -H \"Authorization: Bearer $%s\" -d '{}' %s\n", client.EnvToken, endpoint)
		}
	}
	return nil
}
