package main

import (
	"os"

	"github.com/spf13/cobra"

	"stoke.dev/stoke/internal/cli"
)

func newWorkflowCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "workflow",
		Short: "Run workflows: DAGs of jobs whose steps run on warm pools",
	}
	cmd.AddCommand(newWorkflowRunCommand())
	return cmd
}

func newWorkflowRunCommand() *cobra.Command {
	var (
		cf    clientFlags
		file  string
		lo    cli.WorkflowFileOptions
		opts  cli.WorkflowOptions
		sets  []string
		rmaps []string
	)
	cmd := &cobra.Command{
		Use:   "run (-f FILE | NAME) [--set NAME=VALUE]...",
		Short: "Run a workflow and follow it to its result",
		Long: `run creates a WorkflowRun and follows it: each step's output as it runs, each
line prefixed with its job and step ("job/step | "; stdout to stdout, stderr
to stderr), a note when a job does not succeed, and the workflow's result as
the exit status: 0 when it Succeeded, 1 when it Failed or was cancelled
elsewhere (the message names the failed jobs), 130 after Ctrl-C, which
cancels it.

-f FILE is a GitHub Actions workflow file (the subset docs/workflows.md
lists; on: is ignored, runs-on is mapped to a Runtime by --runs-on, else
--runs-on-default) or a WorkflowRun manifest. NAME runs the Workflow of
that name, with its inputs from --set.`,
		Example: `  # A GitHub Actions file, every runs-on on the bash Runtime.
  stoke workflow run -f .github/workflows/ci.yml --runs-on-default bash

  # A Workflow by name, with inputs.
  stoke workflow run release --set version=1.2.3 --set dry_run=true`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (file == "") == (len(args) == 0) {
				return cf.finish(cliError("give exactly one of -f FILE and a Workflow's NAME"))
			}
			var err error
			if lo.Set, err = cli.ParseAssignments("--set", sets); err != nil {
				return cf.finish(err)
			}
			if lo.RunsOn, err = cli.ParseAssignments("--runs-on", rmaps); err != nil {
				return cf.finish(err)
			}
			c, err := cf.client()
			if err != nil {
				return cf.finish(err)
			}
			defer c.Close()
			lo.Namespace = cf.namespace
			wf, err := cli.LoadWorkflow(file, args, os.Stdin, lo)
			if err != nil {
				return cf.finish(err)
			}
			return cf.finish(cli.RunWorkflow(cmd.Context(), c, wf, opts, streams()))
		},
	}
	cf.register(cmd)
	f := cmd.Flags()
	f.StringVarP(&file, "filename", "f", "", "a GitHub Actions workflow file or a WorkflowRun manifest (- for standard input)")
	f.StringArrayVar(&sets, "set", nil, "an input NAME=VALUE (repeatable)")
	f.StringArrayVar(&rmaps, "runs-on", nil, "map a runs-on LABEL=RUNTIME of a GitHub Actions file (repeatable)")
	f.StringVar(&lo.RunsOnDefault, "runs-on-default", "", "the Runtime of a runs-on no --runs-on maps (default bash)")
	f.BoolVarP(&opts.Detach, "detach", "d", false, "print the WorkflowRun's name and return without following it")
	f.BoolVarP(&opts.Quiet, "quiet", "q", false, "print no notes on stderr")
	_ = cmd.MarkFlagFilename("filename", "yml", "yaml", "json")
	return cmd
}
