package main

import (
	"strings"

	"github.com/spf13/cobra"

	"stoke.dev/stoke/internal/cli"
	"stoke.dev/stoke/internal/cli/manifest"
)

func newDeleteCommand() *cobra.Command {
	var (
		cf    clientFlags
		o     cli.DeleteOptions
		files []string
	)
	cmd := &cobra.Command{
		Use:   "delete ([run|runtime|function|workflowrun|workflow] NAME... | KIND/NAME... | [runs|runtimes|functions|workflowruns|workflows] -l SELECTOR | -f FILE)",
		Short: "Delete Runs, Runtimes and Functions",
		Long: `delete removes Runs (a running task is killed; a function drains and
unregisters first) with their logs, and Runtimes (their pods stop), as
kubectl delete takes them: by name (a bare NAME is a Run; "runtime NAME..."
names Runtimes; KIND/NAME mixes kinds), every object of a kind whose labels
match -l (Runs unless "runtimes" is given), or the objects of -f files (the
manifests stoke apply takes). An object that cannot be deleted is reported
and the others are still deleted; delete then exits 1. --wait returns once
every deleted Run is gone.`,
		Example: `  stoke delete task-x7k2p
  stoke delete batch-00 batch-01 batch-02
  stoke delete run/fn-q9d3a runtime/python-big --wait
  stoke delete runtime python-big
  stoke delete -l batch=nightly
  stoke delete -f examples/task.yaml`,
		ValidArgsFunction: completeKindAndName(&cf),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return cf.finish(err)
			}
			defer c.Close()
			switch {
			case len(files) > 0:
				if len(args) > 0 || o.Selector != "" {
					return cf.finish(cliError("-f names the objects: no names or -l with it"))
				}
				var objs []manifest.Object
				for _, name := range files {
					parsed, err := parseManifest(name, cf.namespace)
					if err != nil {
						return cf.finish(err)
					}
					objs = append(objs, parsed...)
				}
				o.Refs = cli.RefsOf(objs)
			case o.Selector != "":
				o.Kind = cli.KindRun
				if len(args) > 1 {
					return cf.finish(cliError("-l takes at most a kind (runs or runtimes), not names"))
				}
				if len(args) == 1 {
					if o.Kind, err = cli.ParseKind(args[0]); err != nil {
						return cf.finish(err)
					}
				}
			default:
				if o.Refs, err = deleteRefs(args); err != nil {
					return cf.finish(err)
				}
			}
			return cf.finish(cli.Delete(cmd.Context(), c, cf.namespace, o, streams()))
		},
	}
	cf.register(cmd)
	f := cmd.Flags()
	f.BoolVar(&o.Wait, "wait", false, "return once every deleted Run is gone")
	f.StringVarP(&o.Selector, "selector", "l", "", "delete the objects whose labels match, e.g. batch=nightly")
	f.StringArrayVarP(&files, "filename", "f", nil, "delete the Runs and Runtimes of this YAML or JSON file, - for standard input (repeatable)")
	f.BoolVar(&o.IgnoreNotFound, "ignore-not-found", false, "count an object that does not exist as deleted")
	_ = cmd.MarkFlagFilename("filename", "yaml", "yml", "json")
	return cmd
}

// deleteRefs reads delete's names: "KIND NAME...", or "NAME..." and
// "KIND/NAME..." mixed (a bare name is a Run).
func deleteRefs(args []string) ([]cli.ObjectRef, error) {
	if len(args) == 0 {
		return nil, cliError("name what to delete: NAME..., KIND NAME..., KIND/NAME..., -l SELECTOR or -f FILE")
	}
	if !strings.Contains(args[0], "/") {
		if kind, err := cli.ParseKind(args[0]); err == nil {
			if len(args) == 1 {
				return nil, cliError("name the " + string(kind) + "s to delete, or select them with -l")
			}
			refs := make([]cli.ObjectRef, 0, len(args)-1)
			for _, name := range args[1:] {
				if strings.Contains(name, "/") {
					return nil, cliError("after a kind come names, not " + name)
				}
				refs = append(refs, cli.ObjectRef{Kind: kind, Name: name})
			}
			return refs, nil
		}
	}
	refs := make([]cli.ObjectRef, 0, len(args))
	for _, a := range args {
		kind, name := cli.KindRun, a
		if k, n, ok := strings.Cut(a, "/"); ok {
			var err error
			if kind, err = cli.ParseKind(k); err != nil {
				return nil, err
			}
			name = n
		}
		if name == "" {
			return nil, cliError(a + ": no name")
		}
		refs = append(refs, cli.ObjectRef{Kind: kind, Name: name})
	}
	return refs, nil
}
