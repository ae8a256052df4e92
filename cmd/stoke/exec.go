package main

import (
	"github.com/spf13/cobra"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/cli"
	"stoke.dev/stoke/internal/gateway"
)

func newExecCommand() *cobra.Command {
	var (
		cf clientFlags
		o  cli.ExecOptions
	)
	cmd := &cobra.Command{
		Use:   "exec [-i] [-t] RUN -- COMMAND [ARGS...]",
		Short: "Run a command inside a running task or a Ready function",
		Long: `exec runs COMMAND inside a Run — a task while it runs, a function while it is
Ready — in its working directory and with its environment, as kubectl exec
and docker exec do. COMMAND is executed directly (never through a shell) and
found on the Run's PATH. -i passes stdin; -t gives it a terminal, and puts
this terminal in raw mode when stdin is one (its window size follows).
stoke exits with the command's status: 126 not executable, 127 not found,
128+N killed by signal N. Ctrl-C without -t ends the session and kills the
command and everything it started (exit 130). An exec never changes the Run.`,
		Example: `  stoke exec -it task-x7k2p -- bash
  stoke exec fn-q9d3a -- ls -l
  echo hello | stoke exec -i task-x7k2p -- wc -c`,
		Args: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 || len(args) < 2 {
				return cliError("usage: stoke exec [-i] [-t] RUN -- COMMAND [ARGS...]")
			}
			return nil
		},
		ValidArgsFunction: func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			if len(args) > 0 {
				return nil, cobra.ShellCompDirectiveDefault // the command's own words
			}
			return completeRunNames(&cf, func(r *v1alpha1.Run) bool { return gateway.Execable(r) == nil })(cmd, args, toComplete)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return cf.finish(err)
			}
			defer c.Close()
			return cf.finish(cli.Exec(cmd.Context(), c, cf.namespace, args[0], args[1:], o, streams()))
		},
	}
	cf.register(cmd)
	cmd.Flags().BoolVarP(&o.Stdin, "stdin", "i", false, "pass stdin to the command")
	cmd.Flags().BoolVarP(&o.TTY, "tty", "t", false, "give the command a terminal")
	return cmd
}
