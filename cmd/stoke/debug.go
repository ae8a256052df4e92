package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"stoke.dev/stoke/internal/debugsock"
)

// debugSocketUsage documents every command's --debug-socket flag.
const debugSocketUsage = "Unix socket serving Go's profiles (net/http/pprof; read with 'stoke debug pprof'); its directory is made 0700; empty: none"

// serveDebug serves the profiles on path until the returned stop is
// called; an empty path serves nothing.
func serveDebug(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	s, err := debugsock.Listen(path)
	if err != nil {
		return nil, err
	}
	return func() { _ = s.Close() }, nil
}

func newDebugCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "debug",
		Short: "Inspect a running Stoke process",
	}
	cmd.AddCommand(newDebugPprofCommand())
	return cmd
}

func newDebugPprofCommand() *cobra.Command {
	var socket, output string
	var seconds int
	var debug int
	cmd := &cobra.Command{
		Use:   "pprof [PROFILE]",
		Short: "Copy a Go profile from a Stoke process's debug socket",
		Long: `pprof asks the Stoke process serving --socket (its --debug-socket) for one of
Go's runtime profiles and writes it to --output (default stdout), for
'go tool pprof'. PROFILE is profile (CPU, for --seconds; the default), heap,
allocs, goroutine, mutex, block, threadcreate or trace. The socket is a Unix
socket in a 0700 directory: run this inside the process's container, as its
user.`,
		Example: `  kubectl exec -n stoke-system deploy/stoke-controller -- stoke debug pprof --socket /var/run/stoke-controller/probe/debug.sock --seconds 20 > controller.pprof
  kubectl exec POD -c runtimed -- stoke debug pprof --socket /var/run/stoke/runtimed/debug.sock heap > heap.pprof
  go tool pprof -top controller.pprof`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := "profile"
			if len(args) == 1 {
				name = args[0]
			}
			q := url.Values{}
			if name == "profile" || name == "trace" {
				q.Set("seconds", strconv.Itoa(seconds))
			}
			if debug > 0 {
				q.Set("debug", strconv.Itoa(debug))
			}
			// A profile over seconds, plus time to write it.
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Duration(seconds)*time.Second+30*time.Second)
			defer cancel()
			if output == "" {
				return debugsock.Fetch(ctx, socket, name, q, cmd.OutOrStdout())
			}
			f, err := os.OpenFile(output, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
			if err != nil {
				return err
			}
			if err := debugsock.Fetch(ctx, socket, name, q, f); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return fmt.Errorf("%s: %w", output, err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&socket, "socket", "", "the process's debug socket (its --debug-socket)")
	f.StringVarP(&output, "output", "o", "", "file to write (default stdout)")
	f.IntVar(&seconds, "seconds", 30, "how long a CPU profile or trace lasts")
	f.IntVar(&debug, "debug", 0, "pprof's debug parameter: 1 or 2 give text (goroutine stacks, heap summaries)")
	_ = cmd.MarkFlagRequired("socket")
	return cmd
}
