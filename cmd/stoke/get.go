package main

import (
	"time"

	"github.com/spf13/cobra"

	"stoke.dev/stoke/internal/cli"
	"stoke.dev/stoke/internal/cli/printer"
)

func newGetCommand() *cobra.Command {
	var (
		cf     clientFlags
		o      cli.GetOptions
		format string
	)
	cmd := &cobra.Command{
		Use:   "get runs|runtimes|functions|workflowruns|workflows [NAME]",
		Short: "List Runs, Runtimes, Functions, WorkflowRuns or Workflows, or show one",
		Long: `get prints Runs, Runtimes, Functions, WorkflowRuns or Workflows as a table (-o wide adds columns), as JSON or
YAML (-o json|yaml, the objects as the API serves them), or as kind/name
lines (-o name). -w keeps printing every change until Ctrl-C; a deleted
object's row shows Deleted as its phase, and --output-watch-events adds each
change's type (ADDED, MODIFIED, DELETED) as kubectl does.`,
		Example: `  stoke get runs
  stoke get runs -A -o wide
  stoke get run task-x7k2p -o yaml
  stoke get runs -l team=platform -w
  stoke get runtimes
  stoke get workflowruns`,
		Args: cobra.RangeArgs(1, 2),
		ValidArgsFunction: func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			switch len(args) {
			case 0:
				return []cobra.Completion{"runs", "runtimes", "functions", "workflowruns", "workflows"}, cobra.ShellCompDirectiveNoFileComp
			case 1:
				kind, err := cli.ParseKind(args[0])
				if err != nil {
					return nil, cobra.ShellCompDirectiveNoFileComp
				}
				return completeNames(cmd, &cf, kind, toComplete, nil)
			}
			return nil, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, err := cli.ParseKind(args[0])
			if err != nil {
				return cf.finish(err)
			}
			if o.Format, err = printer.ParseFormat(format); err != nil {
				return cf.finish(err)
			}
			o.Kind, o.Now = kind, time.Now
			if len(args) == 2 {
				o.Name = args[1]
			}
			c, err := cf.client()
			if err != nil {
				return cf.finish(err)
			}
			defer c.Close()
			o.Namespace = cf.namespace
			return cf.finish(cli.Get(cmd.Context(), c, o, streams()))
		},
	}
	cf.register(cmd)
	f := cmd.Flags()
	f.StringVarP(&format, "output", "o", "", "output format: wide, json, yaml or name")
	f.BoolVarP(&o.Watch, "watch", "w", false, "after the current objects, print every change")
	f.BoolVar(&o.WatchEvents, "output-watch-events", false, "with -w, print each change's type (ADDED, MODIFIED, DELETED) as kubectl does")
	f.BoolVarP(&o.AllNamespaces, "all-namespaces", "A", false, "objects of every namespace")
	f.StringVarP(&o.LabelSelector, "selector", "l", "", "label selector, e.g. team=platform,tier!=batch")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]cobra.Completion{"wide", "json", "yaml", "name"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}
