package lambdasim

import (
	"bytes"
	"os"
	"strconv"
)

// Processes returns the live processes named comm (zombies aside) whose
// environment holds entry ("K=V"): a test finds what a sandbox runs by a
// variable it gave the function, since the sandbox's processes are this
// machine's. Lambda itself offers no such view.
func Processes(comm, entry string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dir := "/proc/" + e.Name() + "/"
		c, err := os.ReadFile(dir + "comm")
		if err != nil || string(bytes.TrimSpace(c)) != comm {
			continue
		}
		if st, err := os.ReadFile(dir + "stat"); err != nil || zombie(st) {
			continue
		}
		env, err := os.ReadFile(dir + "environ")
		if err != nil {
			continue
		}
		for kv := range bytes.SplitSeq(env, []byte{0}) {
			if string(kv) == entry {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// zombie reads the state of /proc/PID/stat, which follows the command
// name's closing parenthesis.
func zombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X'
}
