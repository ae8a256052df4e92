package main

import (
	"os"

	"github.com/spf13/cobra"

	"stoke.dev/stoke/internal/cli"
	"stoke.dev/stoke/internal/cli/runspec"
)

func newRunCommand() *cobra.Command {
	var (
		cf   clientFlags
		o    runspec.Options
		opts cli.RunOptions
	)
	cmd := &cobra.Command{
		Use:   "run --runtime RUNTIME [flags] [--] [ARGS...]",
		Short: "Run a task and follow it to its exit code, or start a function",
		Long: `run creates a Run on a warm runtime pool.

A task (no --handler) runs its program once: run streams the program's stdout
and stderr as they come and exits with the program's exit code, like
"docker run". A task that fails without an exit code of its own exits 1 with
a one-line reason; one that times out exits 124. Ctrl-C cancels the Run and
exits 130; with --rm the Run is then deleted too, as it is when it finished.
With -i the program reads this command's stdin (its EOF closes the
program's stdin); with -t it runs on a pseudo-terminal joined to this one
(raw while stdin is a terminal, its window size following), as
"docker run -it": the output then comes through that terminal. Both join
the task's own process through the exec endpoint's attach mode, on stoke up
and through a cluster's gateway alike.
The program is ARGS (the first is the command), or --entrypoint
(a file of the source) with ARGS as its arguments; a single-file --source
with no --entrypoint is itself the entrypoint. Outputs the task writes as
KEY=VALUE lines to $STOKE_OUTPUTS are printed to stderr at the end.

A function (--handler) is loaded once and then serves invocations: run waits
until it is Ready, prints its invoke URL on stdout and how to call it on
stderr. Bash handlers are path/file.function (file.sh without ".sh"),
Python handlers module.function.

A Function (--handler with --scale MIN:MAX, and --name) is a function by
name: a stable invoke URL (/v1/namespaces/NS/functions/NAME/invoke) and
between MIN and MAX replicas, each an ordinary function Run, scaled by
Stoke; run prints its URL once MIN replicas are Ready. Without --scale,
--handler starts one function Run, as before (docs/functions.md).

--source packs a local file (as inline text) or directory (as a tar.gz of at
most 1 MiB, regular files, directories and symlinks to files inside it).`,
		Example: `  # A task: prints hello, exits with its exit code.
  stoke run --runtime bash -- echo hello

  # An interactive shell on a terminal; stdin to a program.
  stoke run -it --rm --runtime bash -- bash
  echo hi | stoke run -i --rm --runtime bash -- cat

  # A script from a file, with arguments, env, a timeout and two retries.
  stoke run --runtime bash --source examples/task/task.sh --env GREETING=hi --timeout 30s --retries 2 -- world

  # A Python task from a directory.
  stoke run --runtime python --source ./job --entrypoint main.py -- --verbose

  # A warm Bash function, then an invocation.
  stoke run --runtime bash --source examples/bash-echo --handler handler.handle --name echo
  stoke invoke echo -d '{"name":"world"}'

  # A Function: a stable name, 0 to 8 replicas.
  stoke run --runtime python --source examples/python-hello --handler hello.handle --name hello --scale 0:8`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Args, o.LookupEnv = args, os.LookupEnv
			if cmd.Flags().Changed("source") && o.Source == "" {
				return cf.finish(cliError("--source must not be empty"))
			}
			if o.IsFunctionObject() {
				return runFunctionObject(cmd, &cf, o, opts)
			}
			run, err := runspec.Build(o)
			if err != nil {
				return cf.finish(err)
			}
			if opts.Remove && o.IsFunction() {
				return cf.finish(cliError("--rm applies to tasks only; delete a function with stoke delete"))
			}
			if (opts.Stdin || opts.TTY) && o.IsFunction() {
				return cf.finish(cliError("-i and -t apply to tasks only; a function's input is its invocations"))
			}
			c, err := cf.client()
			if err != nil {
				return cf.finish(err)
			}
			defer c.Close()
			run.Namespace = cf.namespace
			if o.IsFunction() {
				return cf.finish(cli.RunFunction(cmd.Context(), c, run, opts, streams()))
			}
			return cf.finish(cli.RunTask(cmd.Context(), c, run, opts, streams()))
		},
	}
	// Flags stop at the first argument, so that a task's own flags need
	// no "--": stoke run --runtime bash ls -l.
	cmd.Flags().SetInterspersed(false)
	cf.register(cmd)
	f := cmd.Flags()
	f.StringVar(&o.Runtime, "runtime", "", "Runtime pool to run on, e.g. bash or python (required)")
	f.StringVar(&o.Source, "source", "", "local file or directory to ship as the program's source")
	f.StringVar(&o.Entrypoint, "entrypoint", "", "task: file of the source to run, with ARGS as its arguments")
	f.StringVar(&o.Handler, "handler", "", "run a function with this handler (Bash path/file.function, Python module.function)")
	f.DurationVar(&o.IdleTimeout, "idle-timeout", 0, "function: end it after this long without invocations (0: never)")
	f.StringVar(&o.Name, "name", "", "name of the Run (default: generated, task-XXXXX or fn-XXXXX)")
	f.StringArrayVarP(&o.Env, "env", "e", nil, "environment variable NAME=VALUE, or NAME to pass this shell's value (repeatable)")
	f.StringArrayVarP(&o.Labels, "label", "l", nil, "label KEY=VALUE (repeatable)")
	f.DurationVar(&o.Timeout, "timeout", 0, "task: execution limit; function: how long it stays reserved (0: the Runtime's default)")
	f.IntVar(&o.Retries, "retries", 0, "retry a failed attempt up to N times (retryPolicy.maxAttempts = N+1)")
	f.DurationVar(&o.TTL, "ttl", 0, "delete the Run this long after it finished (0: keep it)")
	f.BoolVarP(&opts.Detach, "detach", "d", false, "print the Run's name and return without waiting")
	f.BoolVar(&opts.Remove, "rm", false, "task: delete the Run once it finished, or after Ctrl-C cancelled it")
	f.BoolVarP(&opts.Quiet, "quiet", "q", false, "print no notes (retries, outputs, hints) on stderr")
	f.BoolVarP(&opts.Stdin, "interactive", "i", false, "task: pass stdin to the program (its EOF closes the program's stdin)")
	f.BoolVarP(&opts.TTY, "tty", "t", false, "task: run the program on a terminal, this one (raw while stdin is one; its size follows)")
	f.StringVar(&o.Scale, "scale", "", "with --handler and --name: create a Function with MIN:MAX replicas (e.g. 0:8) rather than one function Run")
	_ = cmd.MarkFlagRequired("runtime")
	_ = cmd.RegisterFlagCompletionFunc("runtime", func(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return completeNames(cmd, &cf, cli.KindRuntime, toComplete, nil)
	})
	return cmd
}

// runFunctionObject is `stoke run --scale`: a Function, not a Run.
func runFunctionObject(cmd *cobra.Command, cf *clientFlags, o runspec.Options, opts cli.RunOptions) error {
	if opts.Remove {
		return cf.finish(cliError("--rm applies to tasks only; delete a Function with stoke delete function"))
	}
	o.Namespace = cf.namespace
	fn, err := runspec.BuildFunction(o)
	if err != nil {
		return cf.finish(err)
	}
	c, err := cf.client()
	if err != nil {
		return cf.finish(err)
	}
	defer c.Close()
	fn.Namespace = cf.namespace
	return cf.finish(cli.StartFunction(cmd.Context(), c, fn, opts, streams()))
}
