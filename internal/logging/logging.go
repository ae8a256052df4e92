// Package logging holds Stoke's one rule for loggers: every component takes
// its *slog.Logger from its caller (cmd/stoke builds the process's one
// handler), and a component given none logs nothing. No package below cmd/
// reads or sets slog's global default; archtest checks that.
package logging

import "log/slog"

// OrDiscard returns log, or a logger that discards everything when log is
// nil.
func OrDiscard(log *slog.Logger) *slog.Logger {
	if log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return log
}
