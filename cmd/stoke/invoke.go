package main

import (
	"os"

	"github.com/spf13/cobra"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/cli"
	"stoke.dev/stoke/internal/gateway"
)

func newInvokeCommand() *cobra.Command {
	var (
		cf   clientFlags
		o    cli.InvokeOptions
		data string
	)
	cmd := &cobra.Command{
		Use:   "invoke NAME [-d JSON|@FILE|-]",
		Short: "Invoke a Ready function Run once",
		Long: `invoke sends one JSON input to a Ready function and prints its output. The
input is -d's JSON text, @FILE for a file's content, or - for standard
input; without -d it is {}. A handler failure prints "errorType: message"
(and its stack trace, when the runtime gives one) on stderr and exits 1; an
invocation that runs out of time (--timeout, else the Runtime's default)
exits 124, as a task does. The call reaches the function at most once: it is
never retried.`,
		Example: `  stoke invoke echo -d '{"name":"world"}'
  stoke invoke hello -d @event.json -v
  echo '{"n":3}' | stoke invoke hello -d - --timeout 5s`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeRunNames(&cf, func(r *v1alpha1.Run) bool { return gateway.Invocable(r) == nil }),
		RunE: func(cmd *cobra.Command, args []string) error {
			input, err := cli.ReadInput(data, os.Stdin)
			if err != nil {
				return cf.finish(err)
			}
			c, err := cf.client()
			if err != nil {
				return cf.finish(err)
			}
			defer c.Close()
			return cf.finish(cli.Invoke(cmd.Context(), c, cf.namespace, args[0], input, o, streams()))
		},
	}
	cf.register(cmd)
	f := cmd.Flags()
	f.StringVarP(&data, "data", "d", "", "input: JSON text, @FILE, or - for standard input (default {})")
	f.StringVar(&o.InvocationID, "invocation-id", "", "invocation ID to send (at most 128 bytes; default: generated)")
	f.DurationVar(&o.Timeout, "timeout", 0, "bound the invocation on the server (0: the Runtime's default)")
	f.BoolVarP(&o.Verbose, "verbose", "v", false, "print the invocation ID and the outputs on stderr")
	return cmd
}
