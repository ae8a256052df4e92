package main

import (
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/cgroup"
	"stoke.dev/stoke/internal/cli"
	"stoke.dev/stoke/internal/exec/agent"
	"stoke.dev/stoke/internal/gomaxprocs"
	"stoke.dev/stoke/internal/lambda"
	"stoke.dev/stoke/internal/pydeps"
	"stoke.dev/stoke/internal/runtime/server"
	"stoke.dev/stoke/internal/runuser"
	"stoke.dev/stoke/internal/selfcopy"
)

func newRuntimeServerCommand() *cobra.Command {
	var cfg server.Config
	var containment, debugSocket, runAs string
	var handlerEnv []string
	var lcfg lambda.Config
	cmd := &cobra.Command{
		Use:   "runtime-server",
		Short: "Serve the Pod-local executor.v1 Runtime and FunctionRuntime gRPC services",
		Long: `runtime-server executes code for one runtime pod. It serves executor.v1.Runtime
(one-shot tasks) and executor.v1.FunctionRuntime (warm function registrations),
plus grpc.health.v1.Health and server reflection, so grpcurl works against it.
Every working_dir must lie inside --workspace-root. Each Run's program output
goes to its own bounded log in --run-log-dir; the server's log on stderr
carries events only. Its Go code runs on one thread at a time
(GOMAXPROCS=1) unless the GOMAXPROCS environment variable is set, which then
applies as Go defines it. SIGTERM stops accepting
work, lets work in flight finish for --shutdown-grace, kills the rest and exits 0.

--runtime lambda places Runs on AWS Lambda instead (docs/lambda.md): the
--lambda-* flags configure the functions; credentials, region and endpoint
come from the usual AWS configuration (AWS_REGION, AWS_PROFILE,
AWS_ENDPOINT_URL_LAMBDA, ...).`,
		Example: `  mkdir -p /tmp/stoke-ws/fn && printf 'handle() { printf "%s" "$1"; }\n' > /tmp/stoke-ws/fn/handler.sh
  stoke runtime-server --runtime bash --workspace-root /tmp/stoke-ws`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			gomaxprocs.Apply(os.LookupEnv, server.DefaultGOMAXPROCS)
			cfg.Logger = slog.Default()
			cfg.Subreaper = true
			mode, err := cgroup.ParseMode(containment)
			if err != nil {
				return err
			}
			cfg.Containment = mode
			if runAs != "" {
				if cfg.RunAs, err = runuser.Parse(runAs); err != nil {
					return err
				}
			}
			if cfg.HandlerEnv, err = server.HandlerEnvFrom(handlerEnv, os.Environ()); err != nil {
				return err
			}
			if cfg.Runtime == "lambda" {
				lcfg.StateDir, lcfg.Logger, lcfg.AgentMetrics = cfg.StateDir, cfg.Logger, agent.NewMetrics()
				lcfg.PythonDeps = pydeps.Config{Root: cfg.PythonDeps, FindLinks: cfg.PipFindLinks, Logger: cfg.Logger}
				srv, err := lambda.New(cmd.Context(), lcfg)
				if err != nil {
					return err
				}
				defer srv.Close()
				cfg.Adapter, cfg.Exec, cfg.Collectors = srv, srv.Executor, lcfg.AgentMetrics.Collectors()
			}
			stop, err := serveDebug(debugSocket)
			if err != nil {
				return err
			}
			defer stop()
			return server.Run(cmd.Context(), cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&containment, "containment", string(cgroup.Auto), "how what a task starts is contained: auto (a cgroup v2 per task where this server's cgroup is writable and has cgroup.kill, plus the child subreaper) or subreaper (the child subreaper alone)")
	f.StringVar(&cfg.Runtime, "runtime", "bash", "runtime: bash, python, or lambda")
	f.StringVar(&lcfg.Runtime, "lambda-runtime", "", "lambda: the runtime inside the function, bash or python")
	f.StringVar(&lcfg.Role, "lambda-role", "", "lambda: the functions' execution role ARN")
	f.StringVar(&lcfg.Architecture, "lambda-architecture", "", "lambda: x86_64 or arm64 (default: this binary's)")
	f.Int32Var(&lcfg.MemoryMB, "lambda-memory", lambda.DefaultMemoryMB, "lambda: the functions' memory in MB")
	f.StringVar(&lcfg.NamePrefix, "lambda-name-prefix", lambda.DefaultNamePrefix, "lambda: the start of every function name")
	f.StringVar(&lcfg.Bootstrap, "lambda-bootstrap", "", "lambda: the binary to package as bootstrap, a stoke-lambda-bootstrap or stoke built for the architecture (default: the stoke-lambda-bootstrap beside this stoke, else this stoke)")
	f.StringVar(&lcfg.AgentListen, "lambda-agent-listen", "127.0.0.1:0", "lambda: where exec's reverse agents connect; TLS (--lambda-agent-cert/-key) unless a loopback address")
	f.StringVar(&lcfg.AgentURL, "lambda-agent-url", "", "lambda: the public wss:// URL of --lambda-agent-listen the functions dial (default: its own address, reachable from this machine only)")
	f.StringVar(&lcfg.AgentCert, "lambda-agent-cert", "", "lambda: the agent endpoint's TLS certificate (PEM file)")
	f.StringVar(&lcfg.AgentKey, "lambda-agent-key", "", "lambda: the agent endpoint's TLS key (PEM file)")
	f.DurationVar(&lcfg.AgentWait, "lambda-agent-wait", agent.DefaultWait, "lambda: how long an exec waits for its Run's agent to connect before it fails")
	f.StringVar(&lcfg.Image, "lambda-image", "", "lambda: run the functions as this container image (with a stoke at /opt/stoke/bootstrap) instead of zip packages")
	f.StringVar(&cfg.Listen, "listen", "127.0.0.1:9090", "gRPC listen address: host:port, or unix:PATH for a Unix socket")
	f.StringVar(&cfg.WorkspaceRoot, "workspace-root", "", "directory every working_dir must resolve inside (required)")
	f.StringVar(&cfg.StateDir, "state-dir", "", "directory for private per-registration files (default: a temporary directory)")
	f.StringVar(&cfg.RunLogDir, "run-log-dir", "", "directory of the Runs' output logs, RUN_UID.log (default: run-logs in --state-dir)")
	f.StringVar(&cfg.IPCDir, "ipc-dir", "", "directory for the request files and FIFOs of warm Bash functions, best on tmpfs, removed at exit if empty (default: a private directory on /dev/shm, else in --state-dir)")
	f.StringVar(&cfg.Python, "python", "python3", "python interpreter; resolved once to its real executable")
	f.StringVar(&cfg.PythonDeps, "python-deps", "", "python: the requirements cache shared by the Runtime's servers; a Run's requirements.txt is installed there with pip once per digest (empty: not installed)")
	f.StringVar(&cfg.PipFindLinks, "pip-find-links", "", "python: a directory of wheels pip installs requirements from alone (--no-index); default: pip's own index settings (its config, PIP_* variables)")
	f.StringVar(&cfg.Bash, "bash", "", "bash executable (default: bash on PATH)")
	f.DurationVar(&cfg.DefaultInvokeTimeout, "default-invoke-timeout", bounds.DefaultInvokeTimeout, "invocation timeout when a request gives none")
	f.DurationVar(&cfg.MaxInvokeTimeout, "max-invoke-timeout", bounds.MaxInvokeTimeout, "largest invocation timeout; longer requests are clamped")
	f.DurationVar(&cfg.MaxTaskDuration, "max-task-duration", bounds.MaxTaskDuration, "largest one-shot execution timeout; 0 in a request means this")
	f.DurationVar(&cfg.InitTimeout, "init-timeout", bounds.InitTimeout, "how long loading a handler may take before the registration fails")
	f.DurationVar(&cfg.ShutdownGrace, "shutdown-grace", 10*time.Second, "how long work in flight may finish after SIGTERM")
	f.StringVar(&debugSocket, "debug-socket", "", debugSocketUsage)
	f.StringVar(&runAs, "run-as-user", "", "run the Runs' processes (tasks, handlers, exec sessions) as this unprivileged UID[:GID], without supplementary groups, handing them their working and scratch directories; the server itself stays root (needs root)")
	f.StringArrayVar(&handlerEnv, "handler-env", nil, "NAME of a variable of this server's environment that every handler and task gets beneath its Run's env (repeatable; '*' alone: the whole environment); HOME and TMPDIR are always the Run's own")
	_ = cmd.MarkFlagRequired("workspace-root")
	return cmd
}

// newLambdaRelayCommand is the process a task on Lambda runs as (see
// internal/lambda): hidden, started only by the lambda Runtime Server.
func newLambdaRelayCommand() *cobra.Command {
	var socket, entrypoint string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:    "lambda-relay [--] [ARGS...]",
		Short:  "Relay one task to the lambda Runtime Server (internal)",
		Hidden: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			code, err := lambda.Relay(cmd.Context(), socket, entrypoint, timeout, args, cmd.OutOrStdout(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if code != 0 {
				return &cli.ExitError{Code: code}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&socket, "socket", "", "the Runtime Server's relay socket")
	cmd.Flags().StringVar(&entrypoint, "entrypoint", "", "the task's entrypoint")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "the task's timeout, which Lambda ends it at too (0: the Runtime Server's task timeout)")
	return cmd
}

// newInstallBinaryCommand copies this stoke to a path: the init container
// of a runtime Pod in a user's image runs it (internal/runtimeset).
func newInstallBinaryCommand() *cobra.Command {
	return &cobra.Command{
		Use:    "install-binary DEST",
		Short:  "Copy this stoke executable to DEST (internal: a runtime Pod's init container)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			return selfcopy.To(args[0])
		},
	}
}
