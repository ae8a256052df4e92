package main

import (
	"github.com/spf13/cobra"

	"stoke.dev/stoke/internal/cli"
)

func newDeleteCommand() *cobra.Command {
	var (
		cf   clientFlags
		wait bool
	)
	cmd := &cobra.Command{
		Use:   "delete [run|runtime] NAME",
		Short: "Delete a Run or a Runtime",
		Long: `delete removes a Run (a running task is killed; a function drains and
unregisters first) with its logs, or a Runtime (its pods stop). A bare NAME
is a Run. --wait returns once a Run is gone.`,
		Example: `  stoke delete task-x7k2p
  stoke delete run/fn-q9d3a --wait
  stoke delete runtime python-big`,
		Args:              cobra.RangeArgs(1, 2),
		ValidArgsFunction: completeKindAndName(&cf),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, name, err := kindAndName(args)
			if err != nil {
				return finish(err)
			}
			c, err := cf.client()
			if err != nil {
				return finish(err)
			}
			return finish(cli.Delete(cmd.Context(), c, kind, cf.namespace, name, wait, streams()))
		},
	}
	cf.register(cmd)
	cmd.Flags().BoolVar(&wait, "wait", false, "return once a Run is gone")
	return cmd
}
