package lambdasim

import (
	"fmt"
	"strings"
	"time"
)

// keptSandboxes bounds how many sandboxes' logs the simulator keeps after
// they end: the latest ones, for a failed test to show.
const keptSandboxes = 32

// remember keeps sb's log for SandboxLogs, beyond the sandbox's end.
func (s *Simulator) remember(sb *sandbox) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.boxes) == keptSandboxes {
		s.boxes = append(s.boxes[:0], s.boxes[1:]...)
	}
	s.boxes = append(s.boxes, sb)
}

// SandboxLogs is what the simulator's latest sandboxes (at most 32), live
// or ended, wrote: the RIE's own lines and the runtime's stdout and stderr
// (its last 64 KiB each), as Lambda sends them to CloudWatch Logs. A test
// prints it when it fails, to show what happened inside the sandboxes.
func (s *Simulator) SandboxLogs() string {
	s.mu.Lock()
	boxes := append([]*sandbox(nil), s.boxes...)
	s.mu.Unlock()
	var b strings.Builder
	for i, sb := range boxes {
		state := "running"
		select {
		case <-sb.p.Done():
			state = fmt.Sprintf("the RIE ended: %v", sb.p.Err())
		default:
		}
		fmt.Fprintf(&b, "--- sandbox %d of %s, started %s, %s:\n", i+1, sb.function, sb.started.UTC().Format(time.StampMicro), state)
		b.Write(sb.logs.since(0, logKeep))
		if !strings.HasSuffix(b.String(), "\n") {
			b.WriteByte('\n')
		}
	}
	return b.String()
}
