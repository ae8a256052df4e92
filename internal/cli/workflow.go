package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/runlog"
)

// WorkflowOptions tune `stoke workflow run`.
type WorkflowOptions struct {
	// Detach prints the new WorkflowRun's name and returns.
	Detach bool
	// Quiet leaves out notes (each job's end) on Err.
	Quiet bool
}

// RunWorkflow creates a WorkflowRun and follows it: each step's log as it
// runs, each line prefixed "job/step | " (stdout to Out, stderr to Err),
// and a note as each job ends. It returns nil when the WorkflowRun
// succeeded, an *ExitError with ExitFailed naming the failed jobs when it
// failed or was cancelled elsewhere, and, after Ctrl-C, cancels it and
// returns ExitInterrupted.
func RunWorkflow(ctx context.Context, c client.API, wf *v1alpha1.WorkflowRun, opts WorkflowOptions, s Streams) error {
	created, err := c.CreateWorkflowRun(ctx, wf)
	if ctx.Err() != nil {
		return interrupted()
	}
	if err != nil {
		return fmt.Errorf("creating the workflowrun: %w", err)
	}
	if opts.Detach {
		fmt.Fprintln(s.Out, created.Name)
		return nil
	}
	if !opts.Quiet {
		s.note("workflowrun %s/%s created", created.Namespace, created.Name)
	}
	f := &wfFollower{c: c, s: s, opts: opts, followed: map[string]bool{}, ended: map[string]bool{}}
	final, err := f.follow(ctx, created)
	f.wg.Wait()
	if ctx.Err() != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if _, err := c.CancelWorkflowRun(cctx, created.Namespace, created.Name); err != nil {
			s.note("interrupted; cancelling workflowrun %s/%s failed: %v", created.Namespace, created.Name, HintFor(c.Target(), err))
		} else {
			s.note("interrupted; cancelled workflowrun %s/%s", created.Namespace, created.Name)
		}
		return interrupted()
	}
	if err != nil {
		return fmt.Errorf("workflowrun %s/%s: %w", created.Namespace, created.Name, err)
	}
	return WorkflowResult(final)
}

// WorkflowResult is the command's result for a finished WorkflowRun: nil
// for Succeeded, ExitFailed with a one-line message otherwise.
func WorkflowResult(wf *v1alpha1.WorkflowRun) error {
	st := &wf.Status
	if st.Phase == v1alpha1.WorkflowSucceeded {
		return nil
	}
	msg := fmt.Sprintf("workflowrun %s/%s %s", wf.Namespace, wf.Name, st.Phase)
	if st.Message != "" {
		msg += ": " + firstLine(st.Message)
	}
	return &ExitError{Code: ExitFailed, Err: errors.New(msg)}
}

type wfFollower struct {
	c    client.API
	s    Streams
	opts WorkflowOptions

	mu       sync.Mutex // serialises lines on Out and Err
	wg       sync.WaitGroup
	followed map[string]bool // step Runs whose log is followed
	ended    map[string]bool // job instances whose end was noted
}

// follow watches the WorkflowRun until it ends, following the log of each
// step Run its status names, and returns it as it ended.
func (f *wfFollower) follow(ctx context.Context, wf *v1alpha1.WorkflowRun) (*v1alpha1.WorkflowRun, error) {
	ns, name := wf.Namespace, wf.Name
	for {
		w, err := f.c.WatchWorkflowRuns(ctx, ns, client.ListOptions{})
		if err != nil {
			return nil, err
		}
		for {
			ev, err := w.Next()
			if err != nil {
				w.Close()
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				if errors.Is(err, io.EOF) || errors.Is(err, errdefs.ErrExpired) {
					break // watch again
				}
				return nil, err
			}
			obj := ev.Object
			if obj == nil || obj.Name != name || obj.UID != wf.UID {
				continue
			}
			if ev.Type == client.Deleted {
				w.Close()
				return nil, errdefs.Errorf(errdefs.ErrNotFound, "it was deleted")
			}
			f.observe(ctx, obj)
			if obj.Status.Phase.Terminal() {
				w.Close()
				return obj, nil
			}
		}
	}
}

// observe starts following the log of each new step Run and notes each
// job that ended.
func (f *wfFollower) observe(ctx context.Context, wf *v1alpha1.WorkflowRun) {
	for _, js := range wf.Status.Jobs {
		for _, st := range js.Steps {
			if st.Run == "" || f.followed[st.Run] {
				continue
			}
			f.followed[st.Run] = true
			prefix := js.Name + "/" + cmpOr(st.ID, st.Name)
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				f.stream(ctx, wf.Namespace, st.Run, prefix)
			}()
		}
		if js.Phase.Terminal() && !f.ended[js.Name] {
			f.ended[js.Name] = true
			if !f.opts.Quiet && js.Phase != v1alpha1.JobSucceeded {
				f.mu.Lock()
				msg := ""
				if js.Message != "" {
					msg = ": " + firstLine(js.Message)
				}
				fmt.Fprintf(f.s.Err, "stoke: job %s %s%s\n", js.Name, js.Phase, msg)
				f.mu.Unlock()
			}
		}
	}
}

// stream copies one step Run's log, each line prefixed.
func (f *wfFollower) stream(ctx context.Context, ns, run, prefix string) {
	// The gateway finds a Run its informer has not seen yet by asking the
	// store.
	l, err := f.c.Logs(ctx, ns, run, true)
	if err != nil {
		if ctx.Err() == nil && !f.opts.Quiet {
			f.mu.Lock()
			fmt.Fprintf(f.s.Err, "stoke: the log of %s (%s): %v\n", prefix, run, err)
			f.mu.Unlock()
		}
		return
	}
	defer l.Close()
	for {
		rec, err := l.Next()
		if err != nil {
			return
		}
		f.mu.Lock()
		switch rec.Stream {
		case runlog.StreamStdout:
			fmt.Fprintf(f.s.Out, "%s | %s\n", prefix, rec.Line)
		case runlog.StreamStderr:
			fmt.Fprintf(f.s.Err, "%s | %s\n", prefix, rec.Line)
		}
		f.mu.Unlock()
	}
}

func cmpOr(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
