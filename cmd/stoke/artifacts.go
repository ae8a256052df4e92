package main

import (
	"time"

	"github.com/spf13/cobra"

	"stoke.dev/stoke/internal/cli"
)

func newArtifactsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "artifacts",
		Short: "List and fetch a WorkflowRun's artifacts",
		Long: `artifacts lists the artifacts a WorkflowRun's upload-artifact steps stored, and
writes one of them into a directory. They go when the WorkflowRun is deleted.`,
	}
	cmd.AddCommand(newArtifactsListCommand(), newArtifactsGetCommand())
	return cmd
}

func newArtifactsListCommand() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:     "ls WORKFLOWRUN",
		Aliases: []string{"list"},
		Short:   "List a WorkflowRun's artifacts",
		Example: `  stoke artifacts ls ci-x7k2p`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return cf.finish(err)
			}
			defer c.Close()
			return cf.finish(cli.ArtifactsList(cmd.Context(), c, cf.namespace, args[0], time.Now, streams()))
		},
	}
	cf.register(cmd)
	return cmd
}

func newArtifactsGetCommand() *cobra.Command {
	var (
		cf  clientFlags
		dir string
	)
	cmd := &cobra.Command{
		Use:   "get WORKFLOWRUN NAME",
		Short: "Write one artifact's files into a directory",
		Long: `get writes the files of the artifact NAME of a WorkflowRun into a directory (-o,
default the current one), made when missing. Every entry is checked: nothing is
written outside the directory, and the bytes must match the artifact's digest.`,
		Example: `  stoke artifacts get ci-x7k2p dist -o ./dist`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return cf.finish(err)
			}
			defer c.Close()
			return cf.finish(cli.ArtifactsGet(cmd.Context(), c, cf.namespace, args[0], args[1], dir, streams()))
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVarP(&dir, "output", "o", ".", "the directory to write the files into")
	return cmd
}
