package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/procfs"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// cpuTimes is the CPU time (user + system, without children's: a task
// Run's own processes are not Stoke's) each kind of process has used:
// stoke's by role (controller, runtimed, runtime-server), the cluster's
// components by name, and e2e.test itself (the benchmark's clients and
// the node agents).
type cpuTimes map[string]time.Duration

// cpu samples the CPU time of this cluster's processes: the components'
// (kubetest's pids) and every stoke container process of a Pod of this
// cluster (found by its POD_NAME, which names a Pod of this cluster, so
// that other clusters on the host do not count).
func (e *kubeEnv) cpu(t testing.TB) cpuTimes {
	t.Helper()
	out := cpuTimes{}
	for _, pid := range e.cluster.Pids() {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if d, ok := procCPU(pid); ok {
			out[strings.TrimSpace(string(comm))] += d
		}
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		out["e2e.test"] = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	pods := map[string]bool{}
	for _, ns := range []string{stokeNamespace, runsNamespace} {
		l, err := e.kube.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range l.Items {
			pods[p.Name] = true
		}
	}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range dirs {
		pid, err := strconv.Atoi(filepath.Base(dir))
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(dir + "/cmdline")
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		// A container's stoke, not an exec probe (stoke ROLE probe) nor
		// stoke debug.
		if len(argv) < 2 || filepath.Base(argv[0]) != "stoke" || !stokeRoles[argv[1]] || (len(argv) > 2 && argv[2] == "probe") {
			continue
		}
		env, err := os.ReadFile(dir + "/environ")
		if err != nil || !pods[podNameIn(env)] {
			continue
		}
		if d, ok := procCPU(pid); ok {
			out["stoke "+argv[1]] += d
		}
	}
	return out
}

// stokeRoles are the commands of the stoke containers: the gateways
// too, which the chart installs and which decode every Run event as
// the controller and runtimed do.
var stokeRoles = map[string]bool{"controller": true, "runtimed": true, "runtime-server": true, "gateway": true}

// podNameIn is POD_NAME in a process's environment block.
func podNameIn(environ []byte) string {
	for _, kv := range bytes.Split(environ, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("POD_NAME=")); ok {
			return string(v)
		}
	}
	return ""
}

// procCPU is a process's utime + stime.
func procCPU(pid int) (time.Duration, bool) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, false
	}
	st, err := p.Stat()
	if err != nil {
		return 0, false
	}
	return time.Duration(st.CPUTime() * float64(time.Second)), true
}

func (c cpuTimes) minus(before cpuTimes) cpuTimes {
	out := cpuTimes{}
	for k, v := range c {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

func (c *cpuTimes) add(o cpuTimes) {
	if *c == nil {
		*c = cpuTimes{}
	}
	for k, v := range o {
		(*c)[k] += v
	}
}

// stoke is the CPU time of every stoke process.
func (c cpuTimes) stoke() time.Duration {
	var d time.Duration
	for k, v := range c {
		if strings.HasPrefix(k, "stoke ") {
			d += v
		}
	}
	return d
}

// per lists the CPU time per n Runs in milliseconds, most first.
func (c cpuTimes) per(n float64) string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return c[keys[i]] > c[keys[j]] })
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.2f", k, float64(c[k])/float64(time.Millisecond)/n))
	}
	return strings.Join(parts, ", ")
}
