// Package runlog keeps each Run's program output — a task's stdout and
// stderr, a function's handler output — as a bounded file of JSON records,
// DIR/UID.log. The Runtime Server that runs the program appends to it
// ([Files], [Sink]); `stoke up` serves it to readers that may follow it as
// it grows ([Store], [Reader]). Output never passes through either
// process's own log.
package runlog

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// MaxBytes bounds one Run's output in its log file; past it a truncation
// record is written once and later output is dropped.
const MaxBytes = 8 << 20

// exitReserve is the room past MaxBytes kept for exit records, so that a
// truncated log still says how each attempt ended (one record of about a
// hundred bytes per attempt, at most 100 attempts).
const exitReserve = 64 << 10

// Streams of a record.
const (
	StreamStdout    = "stdout"
	StreamStderr    = "stderr"
	StreamExit      = "exit"
	StreamTruncated = "truncated"
)

// Record is one line of a Run's log, as stored and as served.
type Record struct {
	Time         time.Time `json:"time,omitzero"`
	Attempt      int32     `json:"attempt,omitempty"`
	Stream       string    `json:"stream"`
	Line         string    `json:"line,omitempty"`
	InvocationID string    `json:"invocationId,omitempty"`
	// ExitCode is set on the exit record that ends a task attempt.
	ExitCode *int32 `json:"exitCode,omitempty"`
}

// ExecutionID is the id runtimed gives the execution of a task Run's
// attempt, "UID.ATTEMPT"; the Runtime Server files its output in that
// Run's log ([Files.OpenExecution]).
func ExecutionID(uid string, attempt int32) string {
	return uid + "." + strconv.FormatInt(int64(attempt), 10)
}

// parseExecutionID splits an ExecutionID; ok is false for any other id.
func parseExecutionID(id string) (uid string, attempt int32, ok bool) {
	i := strings.LastIndexByte(id, '.')
	if i <= 0 {
		return "", 0, false
	}
	n, err := strconv.ParseInt(id[i+1:], 10, 32)
	if err != nil || n < 1 {
		return "", 0, false
	}
	return id[:i], int32(n), true
}

// checkName keeps a log's name (a Run UID, or an execution id that is not
// runtimed's) from naming a path outside the directory.
func checkName(name string) error {
	if name == "" || len(name) > 128 || strings.ContainsAny(name, "/\\\x00") || name == "." || name == ".." {
		return fmt.Errorf("%q cannot name a run log", name)
	}
	return nil
}
