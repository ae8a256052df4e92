package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"stoke.dev/stoke/internal/cli"
	"stoke.dev/stoke/internal/client"
	"stoke.dev/stoke/internal/errdefs"
)

// clientFlags are the flags every client command shares: where the server
// is, how to authenticate, and the namespace.
type clientFlags struct {
	settings  client.Settings
	namespace string
}

func (f *clientFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.settings.Server, "server", "", "API server URL (default $"+client.EnvServer+", else http://127.0.0.1:7070)")
	fl.StringVar(&f.settings.Token, "token", "", "API token (default $"+client.EnvToken+", else the token file of --data-dir)")
	fl.StringVar(&f.settings.DataDir, "data-dir", "", "data directory of a local \"stoke up\", for its token file (default $"+client.EnvDataDir+", else the user's state directory)")
	fl.StringVar(&f.settings.CACert, "ca-cert", "", "PEM file of CA certificates to trust for an https:// server (default $"+client.EnvCACert+")")
	fl.StringVarP(&f.namespace, "namespace", "n", client.DefaultNamespace, "namespace")
	_ = cmd.MarkFlagDirname("data-dir")
	_ = cmd.MarkFlagFilename("ca-cert", "pem", "crt")
}

// client resolves the settings (flag, environment, default) into a client.
func (f *clientFlags) client() (*client.Client, error) {
	cfg, err := client.Resolve(f.settings, os.Getenv)
	if err != nil {
		return nil, err
	}
	return client.New(cfg)
}

// streams are the process's standard streams.
func streams() cli.Streams {
	return cli.Streams{In: os.Stdin, Out: os.Stdout, Err: os.Stderr}
}

// finish turns a client command's result into what main reports: a
// one-line error with a hint, and for an *cli.ExitError its exit status.
func finish(err error) error {
	var ee *cli.ExitError
	if errors.As(err, &ee) {
		if ee.Err != nil {
			ee.Err = cli.Hint(ee.Err)
		}
		return ee
	}
	if err == nil {
		return nil
	}
	return cli.Hint(err)
}

// completeRunNames completes the names of Runs in the command's namespace
// by asking the server; without a server it offers nothing.
func completeRunNames(f *clientFlags) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return completeNames(cmd, f, cli.KindRun, toComplete)
	}
}

func completeNames(cmd *cobra.Command, f *clientFlags, kind cli.Kind, prefix string) ([]cobra.Completion, cobra.ShellCompDirective) {
	c, err := f.client()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), 3*time.Second)
	defer cancel()
	var names []string
	if kind == cli.KindRuntime {
		list, err := c.ListRuntimes(ctx, f.namespace, client.ListOptions{})
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		for _, rt := range list.Items {
			names = append(names, rt.Name)
		}
	} else {
		list, err := c.ListRuns(ctx, f.namespace, client.ListOptions{})
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		for _, r := range list.Items {
			names = append(names, r.Name)
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
			names, dir := completeNames(cmd, f, cli.KindRun, toComplete)
			for _, k := range []string{"run", "runtime"} {
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
			return completeNames(cmd, f, kind, toComplete)
		}
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
}

// cliError is a mistake in a command line.
func cliError(msg string) error { return errdefs.Errorf(errdefs.ErrInvalidArgument, "%s", msg) }
