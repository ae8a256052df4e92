package runtimed

import "syscall"

// syscallNoFollow refuses to write through a symlink planted by an earlier
// file of the same archive.
const syscallNoFollow = syscall.O_NOFOLLOW
