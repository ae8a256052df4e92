package main

import (
	"os"

	"github.com/spf13/cobra"

	"stoke.dev/stoke/internal/cli"
	"stoke.dev/stoke/internal/cli/manifest"
)

func newApplyCommand() *cobra.Command {
	var (
		cf    clientFlags
		files []string
	)
	cmd := &cobra.Command{
		Use:   "apply -f FILE",
		Short: "Create Runs and create or update Runtimes and Functions from YAML files",
		Long: `apply reads one or more YAML (or JSON) files of stoke.dev/v1alpha1 Runs and
Runtimes, documents separated by "---". Every document is checked first; if
any is wrong, nothing is sent and the error names the file and document.

Runtimes are applied first (created, configured or unchanged), then Runs,
each in file order. A Run that exists with the same spec is unchanged; one
that exists with another spec is an error, since a Run cannot change: delete
it or give the new one another name. An object without a namespace goes to
--namespace.`,
		Example: `  stoke apply -f examples/runtime.yaml
  stoke apply -f examples/task.yaml -f examples/bash-function.yaml
  stoke get runs -o yaml | stoke apply -f -`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(files) == 0 {
				return cf.finish(cliError("-f is required: a file, or - for standard input"))
			}
			c, err := cf.client()
			if err != nil {
				return cf.finish(err)
			}
			defer c.Close()
			var objs []manifest.Object
			for _, name := range files {
				parsed, err := parseManifest(name, cf.namespace)
				if err != nil {
					return cf.finish(err)
				}
				objs = append(objs, parsed...)
			}
			return cf.finish(cli.Apply(cmd.Context(), c, objs, streams()))
		},
	}
	cf.register(cmd)
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, "YAML or JSON file of Runs and Runtimes, - for standard input (repeatable)")
	_ = cmd.MarkFlagFilename("filename", "yaml", "yml", "json")
	return cmd
}

func parseManifest(name, namespace string) ([]manifest.Object, error) {
	if name == "-" {
		return manifest.Parse(os.Stdin, "standard input", namespace)
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return manifest.Parse(f, name, namespace)
}
