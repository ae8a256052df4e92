package runtimed

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/retry"
)

// waitSlice bounds one Wait call so that cancellation is noticed promptly
// even on a server without Wait (which then falls back to polling).
const waitSlice = 30 * time.Second

func (w *worker) runTask(ctx context.Context, run *v1alpha1.Run, dir string) {
	task := run.Spec.Mode.Task
	// One execution ID per attempt: a retried attempt never finds the
	// previous attempt's execution.
	execID := executionID(w.uid, run.Status.Attempt)
	timeout := w.d.cfg.DefaultTaskTimeout
	if run.Spec.Timeout != nil && run.Spec.Timeout.Duration > 0 {
		timeout = run.Spec.Timeout.Duration
	}
	secs := int64(0)
	if timeout > 0 {
		secs = max(1, int64((timeout+time.Second-1)/time.Second))
	}
	req := &pb.ExecuteRequest{
		Id: execID, Args: task.Args, Env: envMap(run), TimeoutSeconds: secs,
		WorkingDir: dir, Entrypoint: task.Entrypoint,
		Stdin: task.Stdin, Tty: task.TTY,
	}
	if sz := task.TTYSize; sz != nil {
		req.TtySize = &pb.TerminalSize{Width: uint32(sz.Width), Height: uint32(sz.Height)}
	}
	var err error
	if w.adopted {
		// Never started again: what the Runtime Server does not know
		// may have run already.
		err = whileUnavailable(ctx, func() error {
			_, err := w.d.runtime.Status(ctx, &pb.StatusRequest{Id: execID})
			return err
		})
		if status.Code(err) == codes.NotFound {
			w.fail(ctx, retry.ExecutionLost, "runtimed restarted and the runtime server no longer knows the execution")
			return
		}
	} else {
		err = whileUnavailable(ctx, func() error {
			_, err := w.d.runtime.Execute(ctx, req)
			return err
		})
	}
	var executing time.Time // when the Runtime Server had the execution
	if err == nil {
		close(w.executing)
		executing = w.d.cfg.Now()
		if !w.adopted {
			w.d.cfg.Metrics.dispatched(modeTask, executing.Sub(w.taken))
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		if status.Code(err) == codes.InvalidArgument {
			w.fail(ctx, retry.InvalidSpec, status.Convert(err).Message())
		} else {
			w.fail(ctx, retry.RuntimeExecute, "execute: "+status.Convert(err).Message())
		}
		return
	}
	// A deferred claim is written once the task has run RunningAfter;
	// it is stopped (or waited for) before the end is written, so the
	// end is the Run's last write.
	stopClaim := func() {}
	if !w.claimAt.IsZero() && !w.adopted {
		stopClaim = w.claimLater(ctx, execID)
	}
	defer stopClaim()
	defer func() {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := w.d.runtime.Forget(fctx, &pb.ForgetRequest{Id: execID}); err != nil && ctx.Err() == nil {
			w.log.Debug("forget", "error", err)
		}
	}()

	st, err := w.waitExecution(ctx, execID)
	exited := w.d.cfg.Now()
	stopClaim()
	if err != nil {
		if ctx.Err() == nil {
			w.fail(ctx, retry.ExecutionLost, "waiting for the execution: "+status.Convert(err).Message())
		}
		return
	}
	exit := st.GetExitCode()
	outputs := st.GetOutputs()
	exported := exportedEnv(st.GetEnv())
	summary := bounds.Truncate(st.GetSummary(), bounds.StepSummaryStored)
	started := w.claimAt
	setResult := func(r *v1alpha1.Run) {
		agentEnd(r, w.d.cfg.Now())
		if r.Status.StartTime == nil {
			// Not claimed (deferClaim): it ran, and its end is its
			// first write since Scheduled.
			if started.IsZero() {
				started = metav1.NewTime(w.d.cfg.Now())
			}
			r.Status.StartTime = &started
		}
		r.Status.ExitCode = &exit
		if len(outputs) > 0 {
			r.Status.Outputs = outputs
		}
		r.Status.Summary = summary
		if len(exported) > 0 {
			r.Status.Env = exported
		}
	}
	writing := w.d.cfg.Now()
	defer func() { w.logEnded(st.GetState(), executing, exited, writing) }()
	switch st.GetState() {
	case pb.ExecutionState_EXECUTION_STATE_SUCCEEDED:
		w.finish(ctx, v1alpha1.PhaseSucceeded, "Succeeded", "", setResult)
	case pb.ExecutionState_EXECUTION_STATE_CANCELLED:
		w.finish(ctx, v1alpha1.PhaseCancelled, string(retry.Cancelled), "cancelled", setResult)
	case pb.ExecutionState_EXECUTION_STATE_TIMED_OUT:
		w.finish(ctx, v1alpha1.PhaseTimeout, string(retry.Timeout), fmt.Sprintf("exceeded its timeout of %s", time.Duration(secs)*time.Second), setResult)
	default:
		reason := retry.NonZeroExit
		switch {
		case st.GetBackendSetupFailed():
			reason = retry.BackendSetupFailed // never ran: its backend was not there
		case exit < 0:
			reason = retry.RuntimeExecute // the program never ran
		}
		_, err := w.setStatus(ctx, func(r *v1alpha1.Run) bool {
			setResult(r)
			retry.Apply(r, retry.Decide(r, reason, st.GetErrorMessage(), w.d.cfg.Now()))
			return true
		})
		if err != nil && ctx.Err() == nil {
			w.log.Warn("recording failure", "error", err)
		}
	}
}

// logEnded says the task ended and its end was written (or refused),
// with when each stage of its way on this pod ended, on this runtimed's
// clock (BenchmarkKube/WorkflowFanOut100 reads them): took is when the
// Run reached this runtimed (its Run watch), executing when the Runtime
// Server had its execution (the source written, the process started),
// exited when runtimed knew it ended, and writing when its end write
// began; the line's own time is when that write returned.
func (w *worker) logEnded(state pb.ExecutionState, executing, exited, writing time.Time) {
	w.log.Info("task ended", "state", state.String(), "took", w.taken, "executing", executing,
		"exited", exited, "writing", writing, "adopted", w.adopted)
}

// claimLater writes the deferred claim of a started task (deferClaim)
// once it has run Config.RunningAfter, so that a task that ends sooner is
// written once, at its end, and a longer one shows Running while it runs.
// A claim refused because the Run moved on (reassigned, ended by another
// writer) cancels the execution: the Run is no longer this pod's to run.
// stop cancels the pending claim, or waits for the one in flight.
func (w *worker) claimLater(ctx context.Context, execID string) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTimer(w.d.cfg.RunningAfter)
		defer t.Stop()
		select {
		case <-t.C:
		case <-quit:
			return
		case <-ctx.Done():
			return
		}
		if w.claim(ctx, w.claimAt) != nil || ctx.Err() != nil {
			return
		}
		if _, err := w.d.runtime.Cancel(ctx, &pb.CancelRequest{Id: execID}); err != nil && status.Code(err) != codes.NotFound {
			w.log.Warn("cancelling a task whose claim was refused", "error", err)
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(quit)
			<-done
		})
	}
}

// waitExecution waits for a terminal state, cancelling the execution when
// the Run is cancelled or deleted. It uses Wait, and polls Status on a
// server that answers Unimplemented.
func (w *worker) waitExecution(ctx context.Context, id string) (*pb.StatusResponse, error) {
	poll := false
	cancelSent := false
	// What this Run's condition says of its exec agent (none at first:
	// not connected), so that Wait answers when that changes.
	agentSeen := false
	for {
		if cancel, deleted := w.stopRequested(); (cancel || deleted) && !cancelSent {
			cancelSent = true
			if _, err := w.d.runtime.Cancel(ctx, &pb.CancelRequest{Id: id}); err != nil && status.Code(err) != codes.NotFound {
				return nil, err
			}
		}
		var st *pb.StatusResponse
		err := whileUnavailable(ctx, func() (err error) {
			if poll {
				st, err = w.d.runtime.Status(ctx, &pb.StatusRequest{Id: id})
				return err
			}
			wctx, cancel := context.WithTimeout(ctx, waitSlice)
			defer cancel()
			st, err = w.waitOrUpdate(wctx, &pb.StatusRequest{Id: id, AgentConnectedSeen: &agentSeen})
			return err
		})
		if !poll && status.Code(err) == codes.Unimplemented {
			poll = true
			continue
		}
		if err != nil {
			if errors.Is(err, errUpdated) {
				continue
			}
			return nil, err
		}
		if terminal(st.GetState()) {
			return st, nil
		}
		if st.AgentConnected != nil {
			w.noteAgent(ctx, st)
			agentSeen = st.GetAgentConnected()
		}
		if poll {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-w.updates:
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

var errUpdated = errors.New("run updated")

// waitOrUpdate is one Wait call that also returns early (errUpdated) when
// the Run is cancelled or deleted, so that the request is acted on at
// once. Other changes (runtimed's own status writes and their echo from
// the informer) leave the call waiting.
func (w *worker) waitOrUpdate(ctx context.Context, req *pb.StatusRequest) (*pb.StatusResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		st  *pb.StatusResponse
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := w.d.runtime.Wait(ctx, req)
		done <- result{st, err}
	}()
	for {
		select {
		case r := <-done:
			return r.st, r.err
		case <-w.updates:
			if cancelReq, deleted := w.stopRequested(); !cancelReq && !deleted {
				continue
			}
			cancel()
			<-done
			return nil, errUpdated
		}
	}
}

func terminal(s pb.ExecutionState) bool {
	switch s {
	case pb.ExecutionState_EXECUTION_STATE_SUCCEEDED, pb.ExecutionState_EXECUTION_STATE_FAILED,
		pb.ExecutionState_EXECUTION_STATE_TIMED_OUT, pb.ExecutionState_EXECUTION_STATE_CANCELLED:
		return true
	}
	return false
}

// exportedEnv is what the task wrote to $GITHUB_ENV, as status.env: sorted
// by name (a later step's env takes the last value of each name, which
// the Runtime Server already chose).
func exportedEnv(m map[string]string) []v1alpha1.EnvVar {
	if len(m) == 0 {
		return nil
	}
	env := make([]v1alpha1.EnvVar, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		env = append(env, v1alpha1.EnvVar{Name: k, Value: m[k]})
	}
	return env
}
