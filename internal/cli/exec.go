package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/term"

	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/exec"
)

// ExecOptions are stoke exec's flags.
type ExecOptions struct {
	// Stdin passes the CLI's stdin to the command (-i).
	Stdin bool
	// TTY gives the command a terminal (-t); the local terminal is put in
	// raw mode only when stdin is one.
	TTY bool
}

// Exec runs command inside a running task or a Ready function, as kubectl
// exec and docker exec do: its output on Out (and Err without a TTY), the
// CLI's stdin with -i, a terminal with -t that follows the local window's
// size. The CLI exits with the command's status (126 not executable, 127
// not found, 128+N killed by signal N). Cancelling ctx (Ctrl-C without -t;
// with -t and a raw terminal Ctrl-C is a byte for the remote terminal)
// ends the session, which kills the remote command with everything it
// started, and exits 130.
func Exec(ctx context.Context, c client.API, ns, name string, command []string, o ExecOptions, s Streams) error {
	req := exec.Request{RunUID: ns + "/" + name, Command: command, Stdin: o.Stdin, TTY: o.TTY}
	in, inTerm := s.In.(*os.File)
	inTerm = inTerm && term.IsTerminal(int(in.Fd()))
	if req.TTY && !inTerm && req.Stdin {
		s.note("stdin is not a terminal: running without a TTY")
		req.TTY = false
	}
	if req.TTY {
		if out, ok := s.Out.(*os.File); ok && term.IsTerminal(int(out.Fd())) {
			if w, h, err := term.GetSize(int(out.Fd())); err == nil {
				req.Size = exec.TermSize{Width: uint16(w), Height: uint16(h)}
			}
		}
	}
	sess, err := c.Exec().Start(ctx, req)
	if err != nil {
		return err
	}
	defer sess.Close()
	if req.TTY && inTerm && req.Stdin {
		state, err := term.MakeRaw(int(in.Fd()))
		if err != nil {
			return fmt.Errorf("raw terminal: %w", err)
		}
		defer func() { _ = term.Restore(int(in.Fd()), state) }()
	}
	if req.TTY {
		stop := followWindow(ctx, sess, s.Out)
		defer stop()
	}
	streams := exec.Streams{Stdout: s.Out, Stderr: s.Err}
	if req.Stdin {
		streams.Stdin = s.In
	}
	exit, err := sess.Stream(ctx, streams)
	switch {
	case err != nil && ctx.Err() != nil:
		return &ExitError{Code: 130}
	case err != nil:
		return err
	case exit.Code != 0:
		return &ExitError{Code: exit.Code}
	}
	return nil
}

// followWindow sends the local terminal's size on each SIGWINCH until
// stop is called.
func followWindow(ctx context.Context, sess exec.Session, out io.Writer) (stop func()) {
	f, ok := out.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return func() {}
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-winch:
				if w, h, err := term.GetSize(int(f.Fd())); err == nil {
					if err := sess.Resize(exec.TermSize{Width: uint16(w), Height: uint16(h)}); err != nil && !errors.Is(err, context.Canceled) {
						return
					}
				}
			}
		}
	}()
	return func() {
		signal.Stop(winch)
		cancel()
		<-done
	}
}
