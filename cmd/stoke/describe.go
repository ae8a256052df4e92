package main

import (
	"time"

	"github.com/spf13/cobra"

	"stoke.dev/stoke/internal/cli"
)

func newDescribeCommand() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "describe [run|runtime|function|workflowrun] NAME",
		Short: "Show a Run, a Runtime, a Function or a WorkflowRun in detail",
		Long: `describe prints one Run (spec, status, outputs, endpoint, conditions), one
Runtime (spec and pods), one Function, or one WorkflowRun (its DAG: each
job's phase, attempt and pod; each step's phase, exit code and duration)
for people. A bare NAME is a Run.`,
		Example: `  stoke describe run task-x7k2p
  stoke describe fn-q9d3a
  stoke describe runtime python
  stoke describe workflowrun ci-x7k2p`,
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
