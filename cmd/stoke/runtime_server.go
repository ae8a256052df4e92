package main

import (
	"log/slog"
	"time"

	"github.com/spf13/cobra"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/runtime/server"
)

func newRuntimeServerCommand() *cobra.Command {
	var cfg server.Config
	cmd := &cobra.Command{
		Use:   "runtime-server",
		Short: "Serve the Pod-local executor.v1 Runtime and FunctionRuntime gRPC services",
		Long: `runtime-server executes code for one runtime pod. It serves executor.v1.Runtime
(one-shot tasks) and executor.v1.FunctionRuntime (warm function registrations),
plus grpc.health.v1.Health and server reflection, so grpcurl works against it.
Every working_dir must lie inside --workspace-root. Each Run's program output
goes to its own bounded log in --run-log-dir; the server's log on stderr
carries events only. SIGTERM stops accepting
work, lets work in flight finish for --shutdown-grace, kills the rest and exits 0.`,
		Example: `  mkdir -p /tmp/stoke-ws/fn && printf 'handle() { printf "%s" "$1"; }\n' > /tmp/stoke-ws/fn/handler.sh
  stoke runtime-server --runtime bash --workspace-root /tmp/stoke-ws`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Logger = slog.Default()
			cfg.Subreaper = true
			return server.Run(cmd.Context(), cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Runtime, "runtime", "bash", "built-in runtime: bash or python")
	f.StringVar(&cfg.Listen, "listen", "127.0.0.1:9090", "gRPC listen address: host:port, or unix:PATH for a Unix socket")
	f.StringVar(&cfg.WorkspaceRoot, "workspace-root", "", "directory every working_dir must resolve inside (required)")
	f.StringVar(&cfg.StateDir, "state-dir", "", "directory for private per-registration files (default: a temporary directory)")
	f.StringVar(&cfg.RunLogDir, "run-log-dir", "", "directory of the Runs' output logs, RUN_UID.log (default: run-logs in --state-dir)")
	f.StringVar(&cfg.IPCDir, "ipc-dir", "", "directory for the request files and FIFOs of warm Bash functions, best on tmpfs (default: a private directory on /dev/shm, else in --state-dir)")
	f.StringVar(&cfg.Python, "python", "python3", "python interpreter; resolved once to its real executable")
	f.StringVar(&cfg.Bash, "bash", "", "bash executable (default: bash on PATH)")
	f.DurationVar(&cfg.DefaultInvokeTimeout, "default-invoke-timeout", bounds.DefaultInvokeTimeout, "invocation timeout when a request gives none")
	f.DurationVar(&cfg.MaxInvokeTimeout, "max-invoke-timeout", bounds.MaxInvokeTimeout, "largest invocation timeout; longer requests are clamped")
	f.DurationVar(&cfg.MaxTaskDuration, "max-task-duration", bounds.MaxTaskDuration, "largest one-shot execution timeout; 0 in a request means this")
	f.DurationVar(&cfg.InitTimeout, "init-timeout", bounds.InitTimeout, "how long loading a handler may take before the registration fails")
	f.DurationVar(&cfg.ShutdownGrace, "shutdown-grace", 10*time.Second, "how long work in flight may finish after SIGTERM")
	_ = cmd.MarkFlagRequired("workspace-root")
	return cmd
}
