// Command stoke is Stoke's single binary: every role (runtime server, and
// later the control plane, gateway and CLI) is a subcommand.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := newRootCommand().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "stoke:", err)
		stop()
		os.Exit(1)
	}
}
