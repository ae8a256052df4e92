package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"stoke.dev/stoke/internal/client/connect"
	"stoke.dev/stoke/internal/version"
)

func newVersionCommand() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print Stoke's version, commit and Go version (also stoke --version), and the backend client commands use",
		Long: `version prints Stoke's version, then on a second line the backend the client
commands (run, get, invoke, ...) would use with the same flags and
environment — a standalone stoke up or a cluster through a kubeconfig
context — and why it was chosen. It sends nothing to either.`,
		Example: `  stoke version
  stoke version --context kind-stoke`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if _, err := fmt.Fprintln(out, version.Get()); err != nil {
				return err
			}
			c, err := connect.Open(cf.flags, os.Getenv)
			if err != nil {
				mode, why, cerr := connect.Choose(cf.flags, os.Getenv)
				if cerr != nil {
					_, err = fmt.Fprintf(out, "backend: none: %v\n", cerr)
					return err
				}
				_, err = fmt.Fprintf(out, "backend: %s, chosen by %s: %v\n", mode, why, err)
				return err
			}
			defer c.Close()
			_, err = fmt.Fprintf(out, "backend: %s, namespace %s\n", c.Target(), c.Namespace)
			return err
		},
	}
	cf.register(cmd)
	return cmd
}
