// Command invokefloor runs a process of the invoke benchmark's floor
// (package invokefloor): `invokefloor front` (HTTP, which starts the back)
// or `invokefloor back` (gRPC, which starts the python3 worker). The front
// reads its bearer token from INVOKEFLOOR_TOKEN.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"stoke.dev/stoke/internal/invokefloor"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "invokefloor:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: invokefloor front|back [flags]")
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	var back invokefloor.BackConfig
	fs.StringVar(&back.Python, "python", "python3", "the worker's interpreter")
	fs.StringVar(&back.HandlerDir, "handler-dir", "", "the directory holding the handler module")
	fs.StringVar(&back.Module, "module", "", "the handler module, whose handle(event) answers")
	switch args[0] {
	case "front":
		cfg := invokefloor.FrontConfig{Token: os.Getenv("INVOKEFLOOR_TOKEN")}
		fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:0", "the HTTP address")
		fs.StringVar(&cfg.SocketDir, "socket-dir", "", "the 0700 directory for the back's socket")
		fs.IntVar(&cfg.BackProcs, "back-gomaxprocs", 1, "the back's GOMAXPROCS")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		self, err := os.Executable()
		if err != nil {
			return err
		}
		cfg.Self, cfg.Back = self, back
		return invokefloor.RunFront(ctx, cfg, os.Stdout)
	case "back":
		fs.StringVar(&back.Socket, "socket", "", "the Unix socket to serve on")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		return invokefloor.RunBack(ctx, back, os.Stdout)
	}
	return fmt.Errorf("unknown subcommand %q: front or back", args[0])
}
