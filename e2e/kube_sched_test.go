package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"stoke.dev/stoke/internal/testbin"
)

// schedStat is what the kernel's scheduler says of a set of threads
// (/proc/PID/task/TID/schedstat): time on a CPU, time runnable but
// waiting for one (run-queue wait), and how many times they ran.
type schedStat struct {
	cpu, wait time.Duration
	runs      int64
}

func (s schedStat) sub(b schedStat) schedStat {
	return schedStat{s.cpu - b.cpu, s.wait - b.wait, s.runs - b.runs}
}

// schedSampler reads the schedStat of the processes on an invocation's
// path, by role: the benchmark process itself (the client, and whatever
// else runs in it), and each process of the given Pods (POD/ARGV1, the
// Python worker as POD/python), found among this process's descendants
// by their POD_NAME (a Python worker by its parent's). The threads are
// listed once; threads started later are not counted.
type schedSampler struct {
	roles []string
	files [][]string // each role's schedstat files
}

func newSchedSampler(pods ...string) (*schedSampler, error) {
	self := os.Getpid()
	parent, err := testbin.ReadProcTree()
	if err != nil {
		return nil, err
	}
	podOf := func(pid int) string {
		raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		for kv := range bytes.SplitSeq(raw, []byte{0}) {
			if v, ok := bytes.CutPrefix(kv, []byte("POD_NAME=")); ok {
				return string(v)
			}
		}
		return ""
	}
	byRole := map[string][]int{"client": {self}}
	for pid := range parent {
		if !parent.Under(pid, self) {
			continue
		}
		pod, role := podOf(pid), ""
		raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := bytes.Split(raw, []byte{0})
		switch {
		case pod != "" && len(args) > 1 && filepath.Base(string(args[0])) == "stoke":
			role = string(args[1])
		case pod == "" && len(args) > 0 && strings.HasPrefix(filepath.Base(string(args[0])), "python"):
			pod, role = podOf(parent[pid]), "python"
		}
		if role != "" && slices.Contains(pods, pod) {
			byRole[pod+"/"+role] = append(byRole[pod+"/"+role], pid)
		}
	}
	s := &schedSampler{}
	for _, role := range slices.Sorted(func(yield func(string) bool) {
		for r := range byRole {
			if !yield(r) {
				return
			}
		}
	}) {
		var files []string
		for _, pid := range byRole[role] {
			tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
			for _, t := range tasks {
				files = append(files, fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
			}
		}
		s.roles, s.files = append(s.roles, role), append(s.files, files)
	}
	return s, nil
}

// sample is each role's schedStat now.
func (s *schedSampler) sample() []schedStat {
	out := make([]schedStat, len(s.roles))
	for i, files := range s.files {
		for _, f := range files {
			raw, err := os.ReadFile(f)
			if err != nil {
				continue // the thread ended
			}
			v := strings.Fields(string(raw))
			if len(v) < 3 {
				continue
			}
			cpu, _ := strconv.ParseInt(v[0], 10, 64)
			wait, _ := strconv.ParseInt(v[1], 10, 64)
			runs, _ := strconv.ParseInt(v[2], 10, 64)
			out[i].cpu += time.Duration(cpu)
			out[i].wait += time.Duration(wait)
			out[i].runs += runs
		}
	}
	return out
}
