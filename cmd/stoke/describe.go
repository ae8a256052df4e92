package main

import (
	"time"

	"github.com/spf13/cobra"

	"stoke.dev/stoke/internal/cli"
)

func newDescribeCommand() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "describe [run|runtime|function] NAME",
		Short: "Show a Run, a Runtime or a Function in detail",
		Long: `describe prints one Run (spec, status, outputs, endpoint, conditions) or one
Runtime (spec and pods) for people. A bare NAME is a Run.`,
		Example: `  stoke describe run task-x7k2p
  stoke describe fn-q9d3a
  stoke describe runtime python`,
		Args:              cobra.RangeArgs(1, 2),
		ValidArgsFunction: completeKindAndName(&cf),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, name, err := kindAndName(args)
			if err != nil {
				return cf.finish(err)
			}
			c, err := cf.client()
			if err != nil {
				return cf.finish(err)
			}
			defer c.Close()
			return cf.finish(cli.Describe(cmd.Context(), c, kind, cf.namespace, name, time.Now(), streams()))
		},
	}
	cf.register(cmd)
	return cmd
}
