package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/sidecar"
)

func newRuntimedCommand() *cobra.Command {
	var cfg sidecar.Config
	var kubeconfig, debugSocket string
	cmd := &cobra.Command{
		Use:   "runtimed",
		Short: "Run a runtime Pod's runtimed sidecar (Kubernetes mode)",
		Long: `runtimed runs in a Kubernetes runtime Pod beside stoke runtime-server. It takes
the Runs assigned to its own Pod (and no other), drives the Pod's Runtime
Server over its Unix socket, writes the Runs' status, renews the Pod's Lease,
and serves the gateway's invoke and exec hop on --listen behind mutual TLS:
only a client certificate of the CA in --tls-dir with common name
stoke-gateway gets in. The Pod comes from the downward API: POD_NAME,
POD_NAMESPACE, POD_UID (and POD_IP for the default --listen). Its readiness
probe is 'stoke runtimed probe'.`,
		Example: `  stoke runtimed --listen $(POD_IP):7443 --runtime bash`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Logger = slog.Default()
			if err := podFromEnv(&cfg.Pod); err != nil {
				return err
			}
			if cfg.Listen == "" {
				ip := os.Getenv("POD_IP")
				if ip == "" {
					return fmt.Errorf("--listen is not set and POD_IP is empty")
				}
				cfg.Listen = net.JoinHostPort(ip, strconv.Itoa(sidecar.DefaultHopPort))
			}
			stop, err := serveDebug(debugSocket)
			if err != nil {
				return err
			}
			defer stop()
			return sidecar.RunInCluster(cmd.Context(), kubeconfig, cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: the Pod's service account)")
	f.StringVar(&cfg.Listen, "listen", "", "the hop's address (default $POD_IP:7443)")
	f.StringVar(&cfg.TLSDir, "tls-dir", "/var/run/stoke-tls", "the hop's credentials: ca.crt, tls.crt, tls.key (a kubernetes.io/tls Secret with its CA)")
	f.StringVar(&cfg.Pod.Addr, "runtime-server", sidecar.DefaultRuntimeServer, "the Pod's Runtime Server")
	f.StringVar(&cfg.Pod.WorkspaceRoot, "workspace-root", "/workspace", "the workspace shared with the Runtime Server (its --workspace-root)")
	f.StringVar(&cfg.ProbeSocket, "probe-socket", sidecar.DefaultProbeSocket, "the readiness probe's Unix socket; its directory is made 0700")
	f.StringVar(&cfg.Pod.Runtime, "runtime", "", "the Pod's Runtime (for logs)")
	f.StringVar(&cfg.GitCache, "git-cache", "", "the directory of the pod's git cache for the Runs' spec.source.git: a volume of runtimed's container alone, out of the Runs' reach; empty: Runs with a git source fail")
	f.StringVar(&cfg.StateDir, "state-dir", "", "runtimed's own directory on the Pod: a volume of runtimed's container alone that outlives its restarts, where it marks the tasks in a shared workspace it started before writing them Running; empty: those are written Running before they start")
	f.StringVar(&cfg.GitCredentials, "git-credentials", "", "the file of the Runtime's spec.git.credentialsSecret (git's credential-store format: one https://USER:PASSWORD@HOST[/PATH] per line), read again when it changes; sent through git's environment, never its arguments or logs")
	f.StringVar(&cfg.GitCredentialsSecret, "git-credentials-secret", "", "the name of that Secret: only Runs whose spec.source.git.credentialsSecret names it fetch with its credentials, and a Run naming another fails")
	f.StringVar(&cfg.RunLogDir, "run-log-dir", "", "the directory the Runtime Server writes the Runs' logs to (its --run-log-dir), served to the gateway; empty: no logs")
	f.StringVar(&cfg.EndpointBase, "endpoint-base", "", "the gateway's base URL for a Ready function's status.endpoint (default: the path alone)")
	f.DurationVar(&cfg.DefaultTaskTimeout, "default-task-timeout", 0, "the Runtime's spec.defaultTaskTimeout (0: the Runtime Server's maximum)")
	f.DurationVar(&cfg.DefaultFunctionTimeout, "default-function-timeout", 0, "the Runtime's spec.defaultFunctionTimeout (0: no lifetime limit)")
	f.StringVar(&debugSocket, "debug-socket", sidecar.DefaultDebugSocket, debugSocketUsage)
	cmd.AddCommand(newRuntimedProbeCommand())
	return cmd
}

// podFromEnv reads the Pod from the downward API's environment.
func podFromEnv(p *podsource.Pod) error {
	for _, v := range []struct {
		env string
		to  *string
	}{{"POD_NAME", &p.Name}, {"POD_NAMESPACE", &p.Namespace}, {"POD_UID", &p.UID}} {
		*v.to = os.Getenv(v.env)
		if *v.to == "" {
			return fmt.Errorf("%s is not set: runtimed takes its Pod from the downward API", v.env)
		}
	}
	return nil
}

func newRuntimedProbeCommand() *cobra.Command {
	var socket string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "probe",
		Short: "Exit 0 when this Pod's runtimed is ready (its readiness probe)",
		Long: `probe asks the runtimed of this Pod, over its Unix socket, whether it is ready:
its Run informer has synced, its Runtime Server answers, and its Lease was
renewed within its duration. It exits 0 when ready and 1, saying why, when not.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			return sidecar.Probe(ctx, socket)
		},
	}
	cmd.Flags().StringVar(&socket, "probe-socket", sidecar.DefaultProbeSocket, "runtimed's probe socket (its --probe-socket)")
	// The name before stoke controller probe and this one agreed; Pods
	// made by older controllers still pass it.
	cmd.Flags().StringVar(&socket, "socket", sidecar.DefaultProbeSocket, "runtimed's probe socket")
	_ = cmd.Flags().MarkDeprecated("socket", "use --probe-socket, as stoke runtimed and stoke controller probe do")
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "how long the probe may take")
	return cmd
}
