package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"stoke.dev/stoke/internal/cli"
	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/debugsock"
	"stoke.dev/stoke/internal/up"
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
	cmd.AddCommand(newDebugPprofCommand(), newDebugSocketsCommand())
	return cmd
}

func newDebugSocketsCommand() *cobra.Command {
	var dataDir string
	cmd := &cobra.Command{
		Use:   "sockets",
		Short: "List the debug sockets of a local stoke up and its pods",
		Long: `sockets lists the processes of the stoke up serving --data-dir that serve Go's
profiles, and their sockets: stoke up itself ("up") and each runtime pod, by
its name. Name one with 'stoke debug pprof --process'.

STATE is live when the process accepted a connection on its socket (each is
dialled, for up to a second), stale when the socket file is left by a
process that is gone (killed with SIGKILL before it could remove it): the
next stoke up on --data-dir clears it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, err := client.DataDir(dataDir, os.Getenv)
			if err != nil {
				return err
			}
			socks, err := up.DebugSockets(cmd.Context(), dir)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 8, 2, ' ', 0)
			fmt.Fprintln(tw, "PROCESS\tSTATE\tSOCKET")
			for _, s := range socks {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", s.Process, s.State(), s.Path)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", "", dataDirUsage)
	_ = cmd.MarkFlagDirname("data-dir")
	return cmd
}

// dataDirUsage documents the debug commands' --data-dir.
const dataDirUsage = "data directory of the local stoke up (default $" + client.EnvDataDir + ", else the user's state directory)"

func newDebugPprofCommand() *cobra.Command {
	var cf clientFlags
	var socket, process, output string
	var seconds int
	var debug int
	cmd := &cobra.Command{
		Use:   "pprof [PROFILE]",
		Short: "Copy a Go profile from a Stoke process's debug socket",
		Long: `pprof asks a Stoke process for one of Go's runtime profiles on its debug
socket and writes it to --output (default stdout), for 'go tool pprof'.
PROFILE is profile (CPU, for --seconds; the default), heap, allocs,
goroutine, mutex, block, threadcreate or trace.

The process is the local stoke up of --data-dir (the default), or with
--process one of its runtime pods: by its name (as 'stoke debug sockets' and
'stoke describe runtime' show it), by its Runtime's name when that has one
live pod, or by the name of a Run in --namespace, for the pod the Run is on
(its status.assignedPod, asked of the API server as 'stoke get' does; a
pod or Runtime of that name comes first). Or whatever process serves
--socket (its --debug-socket). A socket whose process is gone (stale in
'stoke debug sockets') is refused. The socket is a Unix socket in a 0700
directory: run this as the process's user (in Kubernetes, inside its
container).`,
		Example: `  stoke debug pprof --seconds 5 -o up.pprof
  stoke debug pprof --process my-function --seconds 5 -o fn-pod.pprof   # the pod of Run my-function
  stoke debug sockets      # the pods' names, live or stale
  stoke debug pprof --process python-x7k2p --seconds 5 -o python-pod.pprof
  kubectl exec -n stoke-system deploy/stoke-controller -- stoke debug pprof --socket /var/run/stoke-controller/probe/debug.sock --seconds 20 > controller.pprof
  kubectl exec POD -c runtimed -- stoke debug pprof --socket /var/run/stoke/runtimed/debug.sock heap > heap.pprof
  go tool pprof -top up.pprof`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := "profile"
			if len(args) == 1 {
				name = args[0]
			}
			if socket != "" && (process != "" || cf.flags.DataDir != "") {
				return cliError("--socket names the process alone: no --process or --data-dir with it")
			}
			if socket == "" {
				dir, err := client.DataDir(cf.flags.DataDir, os.Getenv)
				if err != nil {
					return err
				}
				runPod := func(ctx context.Context, run string) (string, error) {
					c, err := cf.client()
					if err != nil {
						return "", err
					}
					defer c.Close()
					return cli.RunPod(ctx, c, cf.namespace, run)
				}
				if socket, err = up.FindDebugSocket(cmd.Context(), dir, process, runPod); err != nil {
					return cf.finish(err)
				}
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
	cf.register(cmd)
	f := cmd.Flags()
	f.Lookup("data-dir").Usage = dataDirUsage + "; also its API token file"
	f.StringVar(&socket, "socket", "", "the process's debug socket (its --debug-socket), instead of --process")
	f.StringVarP(&process, "process", "p", "", "the process of the local stoke up: up (the default), a pod's name, a Runtime's name that has one live pod, or a Run's name (its pod)")
	f.StringVarP(&output, "output", "o", "", "file to write (default stdout)")
	f.IntVar(&seconds, "seconds", 30, "how long a CPU profile or trace lasts")
	f.IntVar(&debug, "debug", 0, "pprof's debug parameter: 1 or 2 give text (goroutine stacks, heap summaries)")
	return cmd
}
