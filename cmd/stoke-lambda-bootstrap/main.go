// Command stoke-lambda-bootstrap is the bootstrap a lambda Runtime Server
// packages into its functions: Stoke's Lambda role alone (the Runtime API
// loop, the bash and Python adapters and exec's reverse agent), without
// the control plane, the CLI and the Kubernetes clients of the stoke
// binary, so that the package stays far under Lambda's 50 MiB
// direct-upload limit (docs/lambda.md). `make build` puts it beside stoke,
// where the Runtime Server finds it; the stoke binary run under the name
// bootstrap does the same job, only four times larger.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"stoke.dev/stoke/internal/lambda/bootstrap"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	cfg := bootstrap.ConfigFromEnv(os.Environ())
	cfg.Logger = bootstrap.LogTo(os.Stderr)
	if err := bootstrap.Run(ctx, cfg); err != nil {
		cfg.Logger.Error("bootstrap stopped", "error", err)
		stop()
		os.Exit(1)
	}
}
