package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/cli/printer"
	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/errdefs"
)

// LogsOptions are `stoke logs`' flags.
type LogsOptions struct {
	Follow     bool
	Timestamps bool
}

// Logs copies a Run's log to s: stdout records to Out, stderr records to
// Err. With Follow it keeps copying until the Run is terminal and then
// notes on Err how it ended (its end state, exit code or reason).
func Logs(ctx context.Context, c client.API, ns, name string, o LogsOptions, s Streams) error {
	var followed *v1alpha1.Run
	if o.Follow {
		// Its UID, to tell at the end this Run from one created again
		// under its name.
		run, err := c.GetRun(ctx, ns, name)
		if err != nil {
			return err
		}
		followed = run
	}
	logs, err := c.Logs(ctx, ns, name, o.Follow)
	if err != nil {
		return err
	}
	defer logs.Close()
	var attempt int32
	for {
		rec, err := logs.Next()
		if ctx.Err() != nil {
			return interrupted()
		}
		if errors.Is(err, io.EOF) {
			if followed == nil {
				return nil
			}
			return noteEnd(ctx, c, followed, s)
		}
		if err != nil {
			return err
		}
		if rec.Attempt > attempt {
			if attempt > 0 {
				s.note("attempt %d", rec.Attempt)
			}
			attempt = rec.Attempt
		}
		writeRecord(rec, s, o.Timestamps)
	}
}

// noteEnd notes on Err how a followed Run ended, once its log stream has
// ended: its end state, or that it was deleted. A stream that ended before
// the Run did (the server stopped) is an error.
func noteEnd(ctx context.Context, c client.API, followed *v1alpha1.Run, s Streams) error {
	run, err := c.GetRun(ctx, followed.Namespace, followed.Name)
	switch {
	case ctx.Err() != nil:
		return interrupted()
	case errors.Is(err, errdefs.ErrNotFound) || (err == nil && run.UID != followed.UID):
		s.note("%s was deleted", Ref(followed))
		return nil
	case err != nil:
		return fmt.Errorf("reading how %s ended: %w", Ref(followed), err)
	case !terminal(run):
		return errdefs.Errorf(errdefs.ErrUnavailable, "the log of %s ended before the run did (is the server stopping?)", Ref(run))
	}
	s.note("%s", endState(run))
	return nil
}

// ReadInput is the input of `stoke invoke -d`: JSON text, @FILE for a
// file's content, or - for standard input; empty means {}. It must be JSON
// of at most 1 MiB.
func ReadInput(data string, stdin io.Reader) ([]byte, error) {
	var (
		b    []byte
		err  error
		from = "-d"
	)
	switch {
	case data == "":
		return []byte("{}"), nil
	case data == "-":
		from = "standard input"
		b, err = io.ReadAll(io.LimitReader(stdin, bounds.InvokeBody+1))
	case strings.HasPrefix(data, "@"):
		from = data[1:]
		b, err = readFileBounded(from, bounds.InvokeBody)
	default:
		b = []byte(data)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the input: %w", err)
	}
	if len(b) > bounds.InvokeBody {
		return nil, errdefs.Errorf(errdefs.ErrTooLarge, "the input from %s exceeds %d bytes", from, bounds.InvokeBody)
	}
	if !json.Valid(b) {
		return nil, errdefs.InvalidArgument("input", "%s is not valid JSON", from)
	}
	return b, nil
}

// readFileBounded reads at most limit+1 bytes of a file, so that a caller
// can tell the file is over limit without reading all of it.
func readFileBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, limit+1))
}

// InvokeOptions are `stoke invoke`'s flags.
type InvokeOptions struct {
	client.InvokeOptions
	// Verbose notes the invocation ID and the outputs on Err.
	Verbose bool
}

// Invoke calls a Function once through its stable URL, or, when there is
// no Function of that name, a Ready function Run once; it writes the
// output to Out (with a final newline when it has none). A name that is
// neither is NotFound, naming both. A handler failure is an error
// "errorType: errorMessage", its stack trace written to Err first; an
// invocation that ran out of time exits ExitTimeout, as a task does.
func Invoke(ctx context.Context, c client.API, ns, name string, input []byte, o InvokeOptions, s Streams) error {
	ref := "function/" + name
	var run *v1alpha1.Run
	res, err := c.InvokeFunction(ctx, ns, name, input, o.InvokeOptions)
	if errors.Is(err, errdefs.ErrNotFound) && ctx.Err() == nil {
		// Not a Function (or a server without Functions): a function Run.
		if run, err = c.GetRun(ctx, ns, name); errors.Is(err, errdefs.ErrNotFound) {
			return errdefs.Errorf(errdefs.ErrNotFound, "%q not found: neither a Function nor a Run has that name%s", name, namespaceFlag(ns))
		} else if err != nil {
			return err
		}
		switch {
		case run.Spec.Mode.Function == nil:
			return errdefs.Errorf(errdefs.ErrFailedPrecondition, "%s is a task; only Functions and function Runs can be invoked", Ref(run))
		case terminal(run):
			return errdefs.Errorf(errdefs.ErrFailedPrecondition, "cannot invoke: %s", endState(run))
		}
		ref = Ref(run)
		res, err = c.Invoke(ctx, run.Namespace, run.Name, string(run.UID), input, o.InvokeOptions)
	}
	if ctx.Err() != nil {
		return interrupted()
	}
	var apiErr *client.APIError
	if errors.As(err, &apiErr) {
		if o.Verbose && apiErr.InvocationID != "" {
			s.note("invocation %s: HTTP %d", apiErr.InvocationID, apiErr.StatusCode)
		}
		if fe := apiErr.Function(); fe != nil {
			if fe.StackTrace != "" {
				fmt.Fprintln(s.Err, strings.TrimRight(fe.StackTrace, "\n"))
			}
			return err
		}
		if run != nil && run.Status.Phase != v1alpha1.PhaseReady && (errors.Is(err, errdefs.ErrUnavailable) || errors.Is(err, errdefs.ErrFailedPrecondition)) {
			return fmt.Errorf("%s is %s, not Ready: %w", Ref(run), printer.PhaseOf(run), err)
		}
	}
	if errors.Is(err, errdefs.ErrDeadlineExceeded) {
		// Ran out of time, as a task that times out does.
		return &ExitError{Code: ExitTimeout, Err: fmt.Errorf("invoking %s: %w", ref, err)}
	}
	if err != nil {
		return fmt.Errorf("invoking %s: %w", ref, err)
	}
	if o.Verbose {
		s.note("invocation %s: HTTP %d, %s", res.InvocationID, res.StatusCode, res.ContentType)
		for _, k := range slices.Sorted(maps.Keys(res.Outputs)) {
			s.note("output %s=%s", k, res.Outputs[k])
		}
	}
	out := res.Body
	if len(out) > 0 && !bytes.HasSuffix(out, []byte("\n")) {
		out = append(out, '\n')
	}
	_, err = s.Out.Write(out)
	return err
}

// Cancel asks the server to cancel a Run; with wait, it returns once the
// Run is terminal and prints how it ended.
func Cancel(ctx context.Context, c client.API, ns, name string, wait bool, s Streams) error {
	run, err := c.CancelRun(ctx, ns, name)
	if err != nil {
		return err
	}
	if terminal(run) {
		fmt.Fprintf(s.Out, "%s already %s\n", Ref(run), run.Status.Phase)
		return nil
	}
	if !wait {
		fmt.Fprintf(s.Out, "%s cancel requested\n", Ref(run))
		return nil
	}
	final, err := waitRun(ctx, c, run.Namespace, run.Name, string(run.UID), terminal)
	if ctx.Err() != nil {
		return interrupted()
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(s.Out, "%s %s\n", Ref(final), final.Status.Phase)
	return nil
}
