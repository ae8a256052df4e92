package main

import (
	"github.com/spf13/cobra"

	"stoke.dev/stoke/internal/cli"
)

func newCancelCommand() *cobra.Command {
	var (
		cf   clientFlags
		wait bool
	)
	cmd := &cobra.Command{
		Use:   "cancel NAME",
		Short: "Cancel a Run",
		Long: `cancel asks the server to cancel a Run: a pending one never starts, a running
task is killed, a function drains and unregisters. The Run ends Cancelled and
stays until deleted. --wait returns once it has ended.`,
		Example: `  stoke cancel task-x7k2p
  stoke cancel fn-q9d3a --wait`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeRunNames(&cf, nil),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return cf.finish(err)
			}
			defer c.Close()
			return cf.finish(cli.Cancel(cmd.Context(), c, cf.namespace, args[0], wait, streams()))
		},
	}
	cf.register(cmd)
	cmd.Flags().BoolVar(&wait, "wait", false, "return once the Run has ended")
	return cmd
}
