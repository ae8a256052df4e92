package runtime

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"time"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/bounds"
	stokeexec "stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/loglines"
	"stoke.dev/stoke/internal/outputs"
	"stoke.dev/stoke/internal/proc"
	"stoke.dev/stoke/internal/runlog"
)

// supervise waits for e's process to exit, its timeout, Cancel or Close,
// kills the group, drains the output and records the outcome.
func (t *Tasks) supervise(e *execution, p *proc.Process, stdio taskIO, attach *stokeexec.Attachment, l launch, started time.Time) {
	defer t.wg.Done()
	outR, errR := stdio.outR, stdio.errR

	drained := make(chan struct{})
	var pumping atomic.Int32
	pumping.Store(1)
	if errR != nil {
		pumping.Store(2)
	}
	pump := func(r io.Reader, buf *tailBuffer, stream string, fd int) {
		defer func() {
			if pumping.Add(-1) == 0 {
				close(drained)
			}
		}()
		var w io.Writer = buf
		if attach != nil {
			// Attach sessions see it as it is read; a slow one holds
			// back the task.
			w = io.MultiWriter(buf, attach.Output(fd))
		}
		src := io.TeeReader(r, w)
		loglines.PumpFlush(untilDropping{src, e.out}, func(line []byte) { e.out.Line(stream, "", line) }, e.out.Flush)
		// Past the log's bound, what is left only feeds the tail buffer
		// (io.Copy to io.Discard would read in small pieces).
		chunk := make([]byte, 64<<10)
		for {
			if _, err := src.Read(chunk); err != nil {
				return
			}
		}
	}
	go pump(outR, &e.stdout, runlog.StreamStdout, 1)
	if errR != nil {
		go pump(errR, &e.stderr, runlog.StreamStderr, 2)
	}

	timer := time.NewTimer(e.timeout)
	defer timer.Stop()
	var stopState pb.ExecutionState // UNSPECIFIED: the process ended by itself
	var stopMsg string
	grace := t.cfg.KillGrace
	select {
	case <-p.Done():
	case <-timer.C:
		stopState, stopMsg = pb.ExecutionState_EXECUTION_STATE_TIMED_OUT, fmt.Sprintf("timed out after %s", e.timeout)
	case <-e.cancelled:
		stopState, stopMsg = pb.ExecutionState_EXECUTION_STATE_CANCELLED, "cancelled"
	case <-t.closing:
		stopState, stopMsg = pb.ExecutionState_EXECUTION_STATE_CANCELLED, "cancelled: the runtime server is shutting down"
		grace = t.closeGrace
	}
	if stopState != pb.ExecutionState_EXECUTION_STATE_UNSPECIFIED {
		select {
		case <-p.Done():
			// It exited before the stop was acted on: its own exit stands.
			stopState = pb.ExecutionState_EXECUTION_STATE_UNSPECIFIED
		default:
			e.log.Info("stopping execution", "reason", stopMsg, "grace", grace)
			p.Kill(grace)
		}
	}
	// Whatever ended the leader, the rest of its group goes too, so that no
	// background job outlives the execution or holds its pipes open.
	p.Kill(0)

	drain := time.NewTimer(pipeDrainGrace)
	select {
	case <-drained:
	case <-drain.C:
		e.log.Warn("output pipes still open after the process group was killed; closing them", "grace", pipeDrainGrace)
		closeAll(outR, errR) // unblocks the pumps' reads
		<-drained
	}
	drain.Stop()
	code := p.ExitCode()
	if attach != nil {
		// After the last output: attach sessions end with the task.
		attach.Finish(stokeexec.Exit{Code: code, Signal: int(p.ExitSignal())})
	}
	closeAll(outR, errR, stdio.stdin)

	var outs results
	state, msg := stopState, stopMsg
	setupFailure, setupFailed := readSetupFailure(l.setupFailure)
	switch {
	case state != pb.ExecutionState_EXECUTION_STATE_UNSPECIFIED:
	case setupFailed:
		// The relayed task never ran: no exit code is the program's.
		state, code, msg = pb.ExecutionState_EXECUTION_STATE_FAILED, noExitCode, setupFailure
		e.mu.Lock()
		e.setupFailed = true
		e.mu.Unlock()
	case code == 0 && p.Err() == nil:
		var err error
		if outs, err = readResults(l); err != nil {
			state, msg = pb.ExecutionState_EXECUTION_STATE_FAILED, "invalid outputs: "+err.Error()
		} else {
			state = pb.ExecutionState_EXECUTION_STATE_SUCCEEDED
		}
		outs.summary = outputs.ReadSummary(l.githubSummary)
	case code < 0:
		state, msg = pb.ExecutionState_EXECUTION_STATE_FAILED, fmt.Sprintf("waiting for the process: %v", p.Err())
	default:
		state, msg = pb.ExecutionState_EXECUTION_STATE_FAILED, exitMessage(code, e.stderr.String())
		// A failed step's summary is kept, as GitHub keeps it.
		outs.summary = outputs.ReadSummary(l.githubSummary)
	}
	t.finish(e, state, int32(code), msg, outs)
	e.log.Info("execution finished", "state", stateLabel(state), "exit_code", code, "duration", time.Since(started))
}

// results are what a task that succeeded reports beside its exit code.
type results struct {
	outputs map[string]string // $STOKE_OUTPUTS's and $GITHUB_OUTPUT's
	env     map[string]string // $GITHUB_ENV's
	summary string            // $GITHUB_STEP_SUMMARY's, bounded
}

// readResults reads the task's $STOKE_OUTPUTS, $GITHUB_OUTPUT and
// $GITHUB_ENV files, each bounded, and checks them against the outputs
// bounds.
func readResults(l launch) (results, error) {
	var r results
	stoke, err := outputs.ReadFile(l.outputs)
	if err != nil {
		return r, err
	}
	r.outputs = stoke
	if l.githubOutput == "" {
		return r, nil
	}
	gh, err := outputs.ReadGitHubFile(l.githubOutput, "$GITHUB_OUTPUT")
	if err != nil {
		return r, err
	}
	if r.outputs, err = outputs.Merge(stoke, gh); err != nil {
		return r, err
	}
	if r.env, err = outputs.ReadGitHubFile(l.githubEnv, "$GITHUB_ENV"); err != nil {
		return r, err
	}
	// $GITHUB_STATE is read as GitHub's runner reads it (a malformed file
	// fails the task) and kept nowhere: its pairs are an action's, for its
	// own post step, which no run step has (docs/runs.md).
	if l.githubState != "" {
		if _, err := outputs.ReadGitHubFile(l.githubState, "$GITHUB_STATE"); err != nil {
			return r, err
		}
	}
	// $GITHUB_PATH's directories reach later steps as the PATH this
	// step had with them before it, in the exported env.
	if l.githubPath != "" {
		dirs, err := outputs.ReadGitHubPath(l.githubPath)
		if err != nil {
			return r, err
		}
		if len(dirs) > 0 {
			if r.env == nil {
				r.env = map[string]string{}
			}
			r.env["PATH"] = outputs.PrependPath(dirs, l.envPath)
		}
	}
	if err := outputs.ValidateEnv(r.env); err != nil {
		return r, err
	}
	return r, nil
}

// readSetupFailure reads a Relayer's $STOKE_SETUP_FAILURE file (path ""
// for other adapters): whether its command wrote one, and what, bounded to
// bounds.Message.
func readSetupFailure(path string) (string, bool) {
	if path == "" {
		return "", false
	}
	f, err := os.Open(path)
	if err != nil {
		return "", false
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, bounds.Message))
	if err != nil {
		return "", false
	}
	msg := strings.TrimSpace(string(b))
	if msg == "" {
		msg = "the backend could not be set up for the task"
	}
	return bounds.Truncate(msg, bounds.Message), true
}

// exitMessage explains a non-zero exit with the end of stderr, where an
// error usually is, bounded to bounds.Message.
func exitMessage(code int, stderr string) string {
	msg := fmt.Sprintf("exited with status %d", code)
	tail := strings.TrimSpace(stderr)
	if tail == "" {
		return msg
	}
	msg += ": "
	return msg + bounds.TruncateHead(tail, bounds.Message-len(msg))
}

// untilDropping reads r until the Sink drops every line, then ends: what
// follows need not be split into lines.
type untilDropping struct {
	r   io.Reader
	out *runlog.Sink
}

func (u untilDropping) Read(p []byte) (int, error) {
	if u.out.Dropping() {
		return 0, io.EOF
	}
	return u.r.Read(p)
}
