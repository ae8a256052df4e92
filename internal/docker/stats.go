package docker

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/moby/moby/api/types/container"

	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
)

// statsInterval is how often a stats stream samples, as Docker's does; a
// one-shot answer without one-shot=true is two samples this far apart,
// so that the client can compute a CPU percentage.
const statsInterval = time.Second

// statsScript samples the task's process tree from /proc in the Run,
// through an exec session (so wherever exec reaches: local pods,
// Kubernetes, Lambda): the processes of the task's process group or
// session (the task leads both) — CPU ticks of each, its reaped
// children's included, and resident pages — then the machine's CPU ticks
// since boot, the clock's ticks per second, the page size, the online
// CPUs and the memory size in KiB. Request data never reaches it.
const statsScript = `p=$` + exec.TaskPIDEnv + ` t=0 r=0 n=0
for d in /proc/[0-9]*; do
  read -r s 2>/dev/null <"$d/stat" || continue
  set -- ${s##*") "}
  [ "$3" = "$p" ] || [ "$4" = "$p" ] || continue
  t=$((t + ${12} + ${13} + ${14} + ${15})); n=$((n + 1))
  read -r _ m _ 2>/dev/null <"$d/statm" && r=$((r + m))
done
read -r _ u ni sy id io irq si st _ </proc/stat
m=0
while read -r k v _; do [ "$k" = MemTotal: ] && m=$v && break; done </proc/meminfo
echo "$t $r $n $((u + ni + sy + id + io + irq + si + st)) $(getconf CLK_TCK 2>/dev/null || echo 100) $(getconf PAGESIZE 2>/dev/null || echo 4096) $(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1) $m"`

// sample is one reading of a task's process tree.
type sample struct {
	read      time.Time
	cpu       container.CPUStats
	memory    container.MemoryStats
	processes uint64
}

// sampleStats reads the container's process tree once.
func (s *Server) sampleStats(ctx context.Context, c *ctr) (sample, error) {
	code, out, err := s.run(ctx, c, []string{"sh", "-c", statsScript, "stats"}, nil)
	if err != nil {
		return sample{}, err
	}
	f := strings.Fields(string(out))
	if code != 0 || len(f) != 8 {
		return sample{}, errdefs.Errorf(errdefs.ErrInternal, "container %s: reading its processes' statistics failed (exit %d): %.200s", c.id[:12], code, out)
	}
	var v [8]uint64
	for i, s := range f {
		if v[i], err = strconv.ParseUint(s, 10, 64); err != nil {
			return sample{}, errdefs.Errorf(errdefs.ErrInternal, "container %s: reading its processes' statistics: %q is not a number", c.id[:12], s)
		}
	}
	ticks, rss, procs, system, hz, page, cpus, memKiB := v[0], v[1], v[2], v[3], max(v[4], 1), v[5], v[6], v[7]
	ns := uint64(time.Second) / hz
	return sample{
		read: time.Now(),
		cpu: container.CPUStats{CPUUsage: container.CPUUsage{TotalUsage: ticks * ns},
			SystemUsage: system * ns, OnlineCPUs: uint32(cpus)},
		memory:    container.MemoryStats{Usage: rss * page, Limit: memKiB << 10},
		processes: procs,
	}, nil
}

// statsOf is Docker's stats answer of a sample after the previous one.
func statsOf(c *ctr, cur, prev sample) container.StatsResponse {
	out := container.StatsResponse{ID: c.id, Name: "/" + c.name, OSType: "linux", Read: cur.read, PreRead: prev.read,
		CPUStats: cur.cpu, PreCPUStats: prev.cpu, MemoryStats: cur.memory,
		PidsStats: container.PidsStats{Current: cur.processes}}
	if out.Read.IsZero() {
		out.Read = time.Now()
	}
	return out
}

// containerStats answers GET /containers/{id}/stats: with stream (the
// default), a sample every statsInterval until the container stops or
// the client goes; without, one answer (two samples apart, unless
// one-shot). A container that does not run has all zeros, as Docker's.
func (s *Server) containerStats(w http.ResponseWriter, r *http.Request) {
	c, err := s.lookup(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	q := r.URL.Query()
	stream, oneShot := true, false
	if v := q.Get("stream"); v != "" {
		if stream, err = strconv.ParseBool(v); err != nil {
			writeError(w, errdefs.InvalidArgument("stream", "is not a boolean"))
			return
		}
	}
	if v := q.Get("one-shot"); v != "" {
		if oneShot, err = strconv.ParseBool(v); err != nil {
			writeError(w, errdefs.InvalidArgument("one-shot", "is not a boolean"))
			return
		}
	}
	oneShot = oneShot && !stream // as Docker 29's: a stream ignores it
	ctx := r.Context()
	var prev sample
	if c.running() {
		// The first sample's errors are the client's, before any answer.
		if prev, err = s.sampleStats(ctx, c); err != nil {
			writeError(w, err)
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if !c.running() || oneShot {
		writeJSONLine(w, statsOf(c, prev, sample{}))
		return
	}
	if stream {
		writeJSONLine(w, statsOf(c, prev, sample{}))
	}
	tick := time.NewTicker(statsInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		cur, err := s.lookup(c.id)
		if err != nil || !cur.running() {
			if !stream {
				writeJSONLine(w, statsOf(c, prev, sample{}))
			}
			return
		}
		next, err := s.sampleStats(ctx, cur)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Info("docker: stats ended", "container", c.id[:12], "error", err)
			}
			return
		}
		writeJSONLine(w, statsOf(cur, next, prev))
		if !stream {
			return
		}
		prev = next
	}
}
