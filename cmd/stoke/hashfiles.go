package main

import (
	"errors"
	"os"

	"github.com/spf13/cobra"

	"stoke.dev/stoke/internal/hashfiles"
)

// newHashFilesCommand is the program of a workflow step's hash Run
// (docs/workflows.md): it runs in the job's workspace, on its pod.
func newHashFilesCommand() *cobra.Command {
	return &cobra.Command{
		Use:    "hash-files PATTERNS...",
		Short:  "Write GitHub's hashFiles() of each argument's patterns to $GITHUB_OUTPUT as h0, h1, ...",
		Hidden: true,
		Args:   cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := os.Getenv("GITHUB_OUTPUT")
			if path == "" {
				return errors.New("hash-files: $GITHUB_OUTPUT is not set: it runs as a workflow step's Run")
			}
			out, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
			if err != nil {
				return err
			}
			home, _ := os.UserHomeDir()
			if err := hashfiles.WriteOutputs(cmd.Context(), ".", home, args, out); err != nil {
				out.Close()
				return err
			}
			return out.Close()
		},
	}
}
