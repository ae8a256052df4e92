package proc

import (
	"context"
	"os/exec"
	"time"
)

// Run starts cmd as Start does and waits for it: it returns the exit
// error (nil for status 0), or, when ctx ends first, ctx's error once the
// whole process group is stopped (Kill with grace). It is for the short
// programs Stoke runs for itself (an interpreter's probe, pip, git),
// which must be recorded children like any other: a Runtime Server is
// the child subreaper of what it starts, and kills a child it did not
// record as an orphan of no scope.
func Run(ctx context.Context, cmd *exec.Cmd, grace time.Duration, opts ...Option) error {
	p, err := Start(cmd, opts...)
	if err != nil {
		return err
	}
	select {
	case <-p.Done():
		return p.Err()
	case <-ctx.Done():
		p.Kill(grace)
		return ctx.Err()
	}
}
