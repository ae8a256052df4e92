package mtls

import (
	"os"
	"syscall"
)

// inode is the file's inode number, 0 where the platform has none: a
// replaced file of the same size and modification time still differs.
func inode(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}
