// Command stoke is Stoke's single binary: every role (runtime server,
// standalone control plane with its HTTP API, and the CLI client) is a
// subcommand. Run under the name bootstrap (a Lambda deployment package's
// entry point), it takes its Lambda role instead.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"stoke.dev/stoke/internal/lambda/bootstrap"
)

// exitCoder is an error that sets the process's exit status (a task's own
// exit code, 130 after Ctrl-C); it is printed only when it wraps a cause.
type exitCoder interface {
	error
	ExitCode() int
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if filepath.Base(os.Args[0]) == "bootstrap" {
		cfg := bootstrap.ConfigFromEnv(os.Environ())
		cfg.Logger = bootstrap.LogTo(os.Stderr)
		if err := bootstrap.Run(ctx, cfg); err != nil {
			cfg.Logger.Error("bootstrap stopped", "error", err)
			os.Exit(1)
		}
		return
	}
	err := newRootCommand().ExecuteContext(ctx)
	stop()
	if err == nil {
		return
	}
	code := 1
	var ec exitCoder
	if errors.As(err, &ec) {
		code = ec.ExitCode()
		if errors.Unwrap(ec) == nil {
			os.Exit(code)
		}
	}
	fmt.Fprintln(os.Stderr, "stoke:", err)
	os.Exit(code)
}
