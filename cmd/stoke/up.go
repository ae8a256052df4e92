package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/cgroup"
	"stoke.dev/stoke/internal/controlplane"
	"stoke.dev/stoke/internal/datadir"
	"stoke.dev/stoke/internal/gomaxprocs"
	"stoke.dev/stoke/internal/lambda"
	"stoke.dev/stoke/internal/runuser"
	"stoke.dev/stoke/internal/up"
)

func newUpCommand() *cobra.Command {
	var cfg up.Config
	var containment, runAs string
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run standalone Stoke on this machine: control plane, runtime pools and HTTP API",
		Long: `up runs all of Stoke in one process tree: the Run store (SQLite in the data
directory), the bash and python runtime pools, the scheduler, and the HTTP API
with the invoke gateway. On first start it writes a random API token to
<data-dir>/token (mode 0600); the CLI on this machine reads it from there.
SIGINT or SIGTERM stops it (under go run, so does the end of the go
command); Runs survive a restart. The data directory must be private (mode
0700, owned by you); one stoke up serves it at a time.

stoke up runs its Go code on half the CPUs Go would give it (at least one),
leaving the rest to its pods, which run theirs on one; GOMAXPROCS in the
environment sets both instead. The "serving" log line says the value
(gomaxprocs).

stoke up and each of its pods serve Go's runtime profiles on a Unix socket
in a 0700 directory (<data-dir>/debug/up.sock, <data-dir>/pods/<pod>/debug.sock):
'stoke debug sockets' lists them, 'stoke debug pprof' reads them.

A finished Run (and its log) is deleted --finished-run-ttl after it finished
unless its spec sets ttlSecondsAfterFinished, which wins; 0 keeps finished
Runs until they are deleted.

When stoke up runs as root, its Runs do not: they run as an unprivileged
user (--run-as-user, default 65533:65533) that can reach its own working,
scratch and output files but not the data directory's token, store, logs or
sockets. The data directory defaults to /var/lib/stoke then, and every
directory above it must let that user pass. The Runs of one stoke up share
that user: they are not isolated from each other.`,
		Example: `  stoke up
  stoke up --data-dir /var/lib/stoke --listen 0.0.0.0:7070 --tls-cert cert.pem --tls-key key.pem
  stoke up --listen 10.0.0.5:7070 --insecure-listen-trusted-network   # plain HTTP, trusted network only
  stoke up --finished-run-ttl 1h`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.DataDir == "" {
				d, err := datadir.Default()
				if err != nil {
					return err
				}
				cfg.DataDir = d
			}
			gomaxprocs.Apply(os.LookupEnv, gomaxprocs.Half())
			if !cmd.Flags().Changed("debug-socket") {
				cfg.DebugSocket = datadir.DebugSocket(cfg.DataDir)
			}
			if !cmd.Flags().Changed("docker-socket") {
				cfg.DockerSocket = datadir.DockerSocket(cfg.DataDir)
			}
			cfg.Logger = slog.Default()
			cfg.Subreaper = true
			mode, err := cgroup.ParseMode(containment)
			if err != nil {
				return err
			}
			cfg.Containment = mode
			if cfg.RunAs, err = runAsUser(runAs, cmd.Flags().Changed("run-as-user")); err != nil {
				return err
			}
			if err := up.StopWithGoRun(); err != nil {
				return err
			}
			return up.Run(cmd.Context(), cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&containment, "containment", string(cgroup.Auto), "how what a Run starts is contained: auto (a cgroup v2 per pod and per task, killed with cgroup.kill, where the host delegates a writable one, plus the child subreaper) or subreaper (the child subreaper alone); see docs/runtime-server.md")
	f.StringVar(&cfg.DataDir, "data-dir", "", "state directory: store, token, pods, Run files (default $XDG_STATE_HOME/stoke or ~/.local/state/stoke)")
	f.StringVar(&cfg.Listen, "listen", datadir.DefaultListen, "HTTP API address; port 0 picks a free port")
	f.StringVar(&cfg.TLSCert, "tls-cert", "", "serve HTTPS with this PEM certificate (with --tls-key)")
	f.StringVar(&cfg.TLSKey, "tls-key", "", "PEM private key of --tls-cert")
	f.BoolVar(&cfg.InsecureListenTrustedNetwork, up.InsecureListenFlag, false,
		"allow plain HTTP (no --tls-cert) on a --listen address that is not loopback: the bearer token then crosses the network in clear text, so only on a network where every host is trusted")
	f.DurationVar(&cfg.LambdaCollectInterval, "lambda-collect-interval", lambda.DefaultCollectInterval,
		"how often functions of lambda Runtimes whose Run is gone are deleted")
	f.StringVar(&cfg.DebugSocket, "debug-socket", "", "Unix socket serving Go's profiles (net/http/pprof; read with 'stoke debug pprof'), its directory made 0700; each pod then serves its own, <data-dir>/pods/<pod>/debug.sock (default <data-dir>/debug/up.sock; empty: none, for the pods too)")
	f.StringVar(&cfg.DockerSocket, "docker-socket", "", "Unix socket serving the Docker Engine API (DOCKER_HOST=unix://PATH; see docs/docker.md), its directory made 0700 (default <data-dir>/docker/docker.sock; empty: none)")
	f.StringVar(&cfg.DockerImages, "docker-images", "", "file of the Docker image → Runtime table (YAML; see docs/docker.md); default: python:* → python, bash/debian/ubuntu/alpine/busybox → bash")
	f.StringVar(&runAs, "run-as-user", "", fmt.Sprintf("when stoke up is root, the unprivileged UID[:GID] its Runs (tasks, handlers, exec sessions) run as, without supplementary groups (default %d:%d, an ID no account has)", runuser.DefaultID, runuser.DefaultID))
	f.StringVar(&cfg.GitCredentials, "git-credentials", "", "file of credentials for the Runs' spec.source.git, in git's credential-store format (one https://USER:PASSWORD@HOST[/PATH] per line); sent as HTTP Basic authentication through git's environment, never its arguments or logs")
	addArtifactS3Flags(f, &cfg.ArtifactS3, "they are kept in the data directory")
	f.DurationVar(&cfg.ArtifactRetention, "artifact-retention", bounds.ArtifactRetentionDefault, "delete a workflow artifact this long after its upload at the latest (its WorkflowRun's delete takes it sooner; at most 90 days)")
	f.DurationVar(&cfg.FinishedRunTTL, "finished-run-ttl", controlplane.DefaultFinishedRunTTL, "delete a finished Run this long after it finished, unless it sets ttlSecondsAfterFinished (0: keep it)")
	return cmd
}

// runAsUser is the user stoke up runs its Runs as: --run-as-user when
// given, else, when stoke up is root, runuser.Default; otherwise nil (as
// stoke up's own user, which is not root).
func runAsUser(flag string, given bool) (*runuser.User, error) {
	if given {
		return runuser.Parse(flag)
	}
	if os.Geteuid() != 0 {
		return nil, nil
	}
	return runuser.Default()
}
