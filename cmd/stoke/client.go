package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/cli"
	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/client/connect"
	"stoke.dev/stoke/internal/errdefs"
)

// clientFlags are the flags every client command shares: which backend
// (a standalone server, or a cluster through a kubeconfig context; the
// rule is internal/client/connect's), how to authenticate, and the
// namespace.
type clientFlags struct {
	flags connect.Flags
	// namespace is the namespace the command works in, once client has
	// resolved it (-n, else the kubeconfig context's, else default).
	namespace string
	// target is where the command went, once client has chosen.
	target client.Target
}

func (f *clientFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.flags.Server, "server", "", "standalone: API server URL (default $"+client.EnvServer+", else the URL of the local stoke up, else http://127.0.0.1:7070)")
	fl.StringVar(&f.flags.Token, "token", "", "standalone: API token (default $"+client.EnvToken+", else the token file of --data-dir)")
	fl.StringVar(&f.flags.DataDir, "data-dir", "", "standalone: data directory of a local \"stoke up\", for its token file (default $"+client.EnvDataDir+", else the user's state directory)")
	fl.StringVar(&f.flags.CACert, "ca-cert", "", "PEM file of CA certificates to trust for an https:// --server or --gateway (default $"+client.EnvCACert+")")
	fl.StringVar(&f.flags.Kubeconfig, "kubeconfig", "", "cluster: kubeconfig file, as kubectl reads it (default $KUBECONFIG, else ~/.kube/config)")
	fl.StringVar(&f.flags.Context, "context", "", "cluster: kubeconfig context (default: the current context)")
	fl.StringVar(&f.flags.Gateway, "gateway", "", "cluster: the gateway's URL for invoke, exec and logs (default: through the API server, the aggregated API gateway.stoke.dev)")
	fl.StringVarP(&f.flags.Namespace, "namespace", "n", "", "namespace (default: the kubeconfig context's on a cluster, else "+client.DefaultNamespace+")")
	_ = cmd.MarkFlagDirname("data-dir")
	_ = cmd.MarkFlagFilename("ca-cert", "pem", "crt")
	_ = cmd.MarkFlagFilename("kubeconfig")
}

// client opens the backend the flags and environment choose (see
// internal/client/connect) and resolves the namespace; the caller closes
// it.
func (f *clientFlags) client() (*connect.Conn, error) {
	c, err := connect.Open(f.flags, os.Getenv)
	if err != nil {
		return nil, err
	}
	f.namespace, f.target = c.Namespace, c.Target()
	return c, nil
}

// streams are the process's standard streams.
func streams() cli.Streams {
	return cli.Streams{In: os.Stdin, Out: os.Stdout, Err: os.Stderr}
}

// finish turns a client command's result into what main reports: a
// one-line error with a hint for the backend the command chose, and for
// an *cli.ExitError its exit status.
func (f *clientFlags) finish(err error) error {
	var ee *cli.ExitError
	if errors.As(err, &ee) {
		if ee.Err != nil {
			ee.Err = cli.HintFor(f.target, ee.Err)
		}
		return ee
	}
	if err == nil {
		return nil
	}
	return cli.HintFor(f.target, err)
}

// completeRunNames completes the names of Runs in the command's namespace
// that reachable accepts (nil: every Run; invoke and exec pass the
// gateway's own rules, gateway.Invocable and gateway.Execable) by asking
// the backend; without one it offers nothing.
func completeRunNames(f *clientFlags, reachable func(*v1alpha1.Run) bool) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return completeNames(cmd, f, cli.KindRun, toComplete, reachable)
	}
}

func completeNames(cmd *cobra.Command, f *clientFlags, kind cli.Kind, prefix string, reachable func(*v1alpha1.Run) bool) ([]cobra.Completion, cobra.ShellCompDirective) {
	c, err := f.client()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(cmd.Context(), 3*time.Second)
	defer cancel()
	var names []string
	switch kind {
	case cli.KindFunction:
		list, err := c.ListFunctions(ctx, f.namespace, client.ListOptions{})
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		for _, fn := range list.Items {
			names = append(names, fn.Name)
		}
	case cli.KindWorkflowRun:
		list, err := c.ListWorkflowRuns(ctx, f.namespace, client.ListOptions{})
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		for _, w := range list.Items {
			names = append(names, w.Name)
		}
	case cli.KindWorkflow:
		list, err := c.ListWorkflows(ctx, f.namespace, client.ListOptions{})
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		for _, w := range list.Items {
			names = append(names, w.Name)
		}
	case cli.KindRuntime:
		list, err := c.ListRuntimes(ctx, f.namespace, client.ListOptions{})
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		for _, rt := range list.Items {
			names = append(names, rt.Name)
		}
	default:
		list, err := c.ListRuns(ctx, f.namespace, client.ListOptions{})
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		for i := range list.Items {
			if reachable == nil || reachable(&list.Items[i]) {
				names = append(names, list.Items[i].Name)
			}
		}
	}
	var out []cobra.Completion
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// kindAndName reads "NAME", "KIND NAME" or "KIND/NAME"; a bare name is a
// Run.
func kindAndName(args []string) (cli.Kind, string, error) {
	switch len(args) {
	case 1:
		if k, name, ok := strings.Cut(args[0], "/"); ok {
			kind, err := cli.ParseKind(k)
			return kind, name, err
		}
		return cli.KindRun, args[0], nil
	case 2:
		kind, err := cli.ParseKind(args[0])
		return kind, args[1], err
	}
	return "", "", fmt.Errorf("want NAME, KIND NAME or KIND/NAME, got %d arguments", len(args))
}

// completeKindAndName completes the kind, then a name of that kind.
func completeKindAndName(f *clientFlags) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		switch len(args) {
		case 0:
			names, dir := completeNames(cmd, f, cli.KindRun, toComplete, nil)
			for _, k := range []string{"run", "runtime", "function", "workflowrun", "workflow"} {
				if strings.HasPrefix(k, toComplete) {
					names = append(names, k)
				}
			}
			return names, dir
		case 1:
			kind, err := cli.ParseKind(args[0])
			if err != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return completeNames(cmd, f, kind, toComplete, nil)
		}
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
}

// cliError is a mistake in a command line.
func cliError(msg string) error { return errdefs.Errorf(errdefs.ErrInvalidArgument, "%s", msg) }
