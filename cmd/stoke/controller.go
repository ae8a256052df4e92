package main

import (
	"cmp"
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/controller"
	"stoke.dev/stoke/internal/controlplane"
	"stoke.dev/stoke/internal/kubeconfig"
	"stoke.dev/stoke/internal/kubepods"
	"stoke.dev/stoke/internal/probe"
)

func newControllerCommand() *cobra.Command {
	var cfg controller.Config
	var kubeconfigPath, debugSocket string
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Run the Kubernetes control plane: scheduler, reaper and Runtime reconciler, with leader election",
		Long: `controller is Stoke's control plane in a Kubernetes cluster. Run and Runtime are
custom resources (stoke.dev/v1alpha1); the controller schedules Runs onto the
runtime Pods (those Ready whose runtimed renews its Lease), retries or fails
the Runs of Pods that are deleted, stay NotReady past --not-ready-grace or
stop renewing their Lease, deletes finished Runs after their TTL, and makes
each Runtime a Deployment of runtime Pods.

Run two or more replicas: they elect a leader on the Lease stoke-controller in
--namespace, and only the leader acts. A leader that loses its Lease exits
with status 1 so that Kubernetes restarts it as a standby.

It opens no unauthenticated port: liveness and readiness are exec probes
("stoke controller probe") over a Unix socket in a 0700 directory, and
/metrics is HTTPS on --metrics-bind-address for callers whose bearer token
the API server authenticates and authorizes for GET /metrics.`,
		Example: `  stoke controller --namespace stoke-system
  stoke controller --kubeconfig ~/.kube/config --namespace stoke-system --probe-socket /tmp/stoke-controller/probe.sock`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rc, err := kubeconfig.Load(kubeconfigPath)
			if err != nil {
				return err
			}
			cfg.REST = rc
			cfg.Logger = slog.Default()
			c, err := controller.New(cfg)
			if err != nil {
				return err
			}
			stop, err := serveDebug(debugSocket)
			if err != nil {
				return err
			}
			defer stop()
			return c.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfigPath, "kubeconfig", "", "kubeconfig file of the cluster (default: the Pod's service account)")
	f.StringVar(&cfg.Namespace, "namespace", cmp.Or(os.Getenv("POD_NAMESPACE"), "stoke-system"), "the controller's namespace: its leader-election Lease, the CA and the gateway's TLS Secret (default $POD_NAMESPACE, else stoke-system)")
	f.StringVar(&cfg.Image, "image", "stoke", "image of the runtime Pods")
	f.StringVar(&cfg.GatewayURL, "gateway-url", "", "the gateway Service's base URL (https://stoke-gateway.stoke-system.svc:443): a Ready function's status.endpoint is its invoke URL under it (default: the path alone)")
	f.StringVar(&cfg.MetricsAddr, "metrics-bind-address", controller.DefaultMetricsAddr, `HTTPS address of /metrics (authenticated and authorized by the API server); "0" disables it`)
	f.StringVar(&cfg.MetricsCertDir, "metrics-cert-dir", "", "directory of /metrics' serving certificate, tls.crt and tls.key (default: a self-signed one)")
	f.StringVar(&cfg.ProbeSocket, "probe-socket", controller.DefaultProbeSocket, "Unix socket of the liveness and readiness probe (its directory is made 0700)")
	f.DurationVar(&cfg.LeaseDuration, "leader-elect-lease-duration", controller.DefaultLeaseDuration, "how long a standby waits after the leader's last renewal before it takes over")
	f.DurationVar(&cfg.RenewDeadline, "leader-elect-renew-deadline", controller.DefaultRenewDeadline, "how long the leader tries to renew its Lease before it stops")
	f.DurationVar(&cfg.RetryPeriod, "leader-elect-retry-period", controller.DefaultRetryPeriod, "how often leader election renews or tries to acquire the Lease")
	f.DurationVar(&cfg.NotReadyGrace, "not-ready-grace", kubepods.DefaultNotReadyGrace, "how long a runtime Pod may stay NotReady before its Runs are retried elsewhere and it is deleted")
	f.DurationVar(&cfg.FinishedRunTTL, "finished-run-ttl", controlplane.DefaultFinishedRunTTL, "delete a finished Run this long after it finished, unless it sets ttlSecondsAfterFinished (0: keep it)")
	addArtifactS3Flags(f, &cfg.ArtifactS3, "no artifact store, and upload-artifact/download-artifact steps fail")
	f.DurationVar(&cfg.ArtifactRetention, "artifact-retention", bounds.ArtifactRetentionDefault, "delete a workflow artifact this long after its upload at the latest (its WorkflowRun's delete takes it sooner; at most 90 days)")
	f.StringVar(&debugSocket, "debug-socket", controller.DefaultDebugSocket, debugSocketUsage)
	cmd.AddCommand(newControllerProbeCommand())
	return cmd
}

func newControllerProbeCommand() *cobra.Command {
	var socket string
	var leader bool
	cmd := &cobra.Command{
		Use:   "probe",
		Short: "Exit 0 if the controller on this Pod's probe socket is serving (the exec probe)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Second)
			defer cancel()
			service := ""
			if leader {
				service = controller.ServiceLeader
			}
			return probe.Check(ctx, socket, service)
		},
	}
	cmd.Flags().StringVar(&socket, "probe-socket", controller.DefaultProbeSocket, "the controller's probe socket")
	cmd.Flags().BoolVar(&leader, "leader", false, "succeed only while this replica leads")
	return cmd
}
