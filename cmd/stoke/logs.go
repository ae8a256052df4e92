package main

import (
	"github.com/spf13/cobra"

	"stoke.dev/stoke/internal/cli"
)

func newLogsCommand() *cobra.Command {
	var (
		cf clientFlags
		o  cli.LogsOptions
	)
	cmd := &cobra.Command{
		Use:   "logs NAME",
		Short: "Print a Run's output",
		Long: `logs prints what a Run wrote: its stdout on stdout, its stderr on stderr, every
attempt in order. For a function, that is what its handler logged (never its
results). -f keeps printing new output until the Run ends, then prints on
stderr how it ended: "stoke: run/NAME Succeeded, exit code 0", or its phase,
reason and message (Timeout, Cancelled, Failed (PodGone), ...).`,
		Example: `  stoke logs task-x7k2p
  stoke logs -f fn-q9d3a --timestamps`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeRunNames(&cf, nil),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return cf.finish(err)
			}
			defer c.Close()
			return cf.finish(cli.Logs(cmd.Context(), c, cf.namespace, args[0], o, streams()))
		},
	}
	cf.register(cmd)
	cmd.Flags().BoolVarP(&o.Follow, "follow", "f", false, "keep printing new output until the Run ends")
	cmd.Flags().BoolVar(&o.Timestamps, "timestamps", false, "start each line with its time")
	return cmd
}
