package bootstrap

import (
	"fmt"
	"strings"
	"syscall"
)

// noSpace annotates a failed task that ran out of the sandbox's ephemeral
// storage (/tmp on Lambda, 512 MB to 10 GB as the function is configured):
// a write that failed with ENOSPC says so on stderr ("No space left on
// device"), or the storage has (almost) nothing left. The task's own exit
// code stays; the message names the cause and the storage's size.
func noSpace(tmpDir, stderr, msg string) (string, bool) {
	var fs syscall.Statfs_t
	full := false
	size := int64(-1)
	if syscall.Statfs(tmpDir, &fs) == nil {
		size = int64(fs.Blocks) * fs.Bsize
		full = int64(fs.Bavail)*fs.Bsize < 1<<20
	}
	if !full && !strings.Contains(stderr, syscall.ENOSPC.Error()) && !strings.Contains(stderr, "No space left on device") {
		return msg, false
	}
	note := "no space left in Lambda's ephemeral storage (" + tmpDir
	if size >= 0 {
		note += fmt.Sprintf(", %d MiB", size>>20)
	}
	note += "): raise the function's ephemeral storage or write less"
	if msg != "" {
		note += "; " + msg
	}
	return note, true
}
