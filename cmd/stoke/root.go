package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"stoke.dev/stoke/internal/logging"
	"stoke.dev/stoke/internal/version"
)

func newRootCommand() *cobra.Command {
	var logLevel string
	root := &cobra.Command{
		Use:           "stoke",
		Short:         "Run short programs and functions on warm runtime pools",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			slog.SetDefault(slog.New(logging.NewJSONHandler(os.Stderr, level)))
			return nil
		},
	}
	root.Version = version.Get().String()
	root.SetVersionTemplate("{{.Version}}\n")
	root.PersistentFlags().StringVar(&logLevel, "log-level", "info", "log level: "+strings.Join([]string{"debug", "info", "warn", "error"}, ", "))
	root.AddCommand(newRuntimeServerCommand(), newLambdaRelayCommand(), newInstallBinaryCommand())
	root.AddCommand(newRunCommand(), newApplyCommand(), newGetCommand(), newDescribeCommand(),
		newLogsCommand(), newInvokeCommand(), newExecCommand(), newCancelCommand(), newDeleteCommand(), newWorkflowCommand(), newArtifactsCommand())
	root.AddCommand(newUpCommand(), newControllerCommand(), newGatewayCommand(), newRuntimedCommand(), newVersionCommand(), newDebugCommand(), newHashFilesCommand())
	return root
}
