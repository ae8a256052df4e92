package up_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/client"
	stokeexec "stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/exec/exectest"
)

// The exec figures issue 9 asks for, through a real `stoke up` (in
// process, real pods) and its gateway. Run with `make bench`.

// execTarget starts stoke up with a running task to exec into.
func execTarget(b *testing.B) (*server, *client.Client, string) {
	s := startUp(b)
	s.create(b, `{"apiVersion":"stoke.dev/v1alpha1","kind":"Run","metadata":{"name":"target"},
 "spec":{"runtime":"bash","mode":{"task":{"args":["sleep","100000"]}}}}`)
	s.waitPhase(b, "target", v1alpha1.PhaseRunning)
	c, err := client.New(client.Config{Server: s.url, Token: s.token})
	if err != nil {
		b.Fatal(err)
	}
	return s, c, "default/target"
}

// byteSignal passes each write's bytes to a channel.
type byteSignal chan []byte

func (c byteSignal) Write(p []byte) (int, error) {
	c <- bytes.Clone(p)
	return len(p), nil
}

// BenchmarkUpExecRoundTrip writes one byte to an exec'd cat and waits for
// it to come back: client → gateway WebSocket → runtimed hop → Runtime
// Server stream → cat's pipe, and back.
func BenchmarkUpExecRoundTrip(b *testing.B) {
	_, c, run := execTarget(b)
	ctx := context.Background()
	sess, err := c.Exec().Start(ctx, stokeexec.Request{RunUID: run, Command: []string{"cat"}, Stdin: true})
	if err != nil {
		b.Fatal(err)
	}
	defer sess.Close()
	inR, inW := io.Pipe()
	out := make(byteSignal, 1)
	done := make(chan error, 1)
	go func() {
		_, err := sess.Stream(ctx, stokeexec.Streams{Stdin: inR, Stdout: out, Stderr: io.Discard})
		done <- err
	}()
	one := func() {
		if _, err := inW.Write([]byte{'x'}); err != nil {
			b.Fatal(err)
		}
		if got := <-out; len(got) != 1 {
			b.Fatalf("read back %q", got)
		}
	}
	for range 100 {
		one()
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		one()
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	inW.Close()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	report(b, lat)
}

// BenchmarkUpExecSetup opens a session running `true` from Go (no process
// start on the client side) and waits for its exit status.
func BenchmarkUpExecSetup(b *testing.B) {
	_, c, run := execTarget(b)
	x := c.Exec()
	call := func() {
		_, _, exit, err := exectest.Collect(context.Background(), x, stokeexec.Request{RunUID: run, Command: []string{"true"}}, nil)
		if err != nil || exit.Code != 0 {
			b.Fatalf("exit %+v, %v", exit, err)
		}
	}
	measureCalls(b, 20, call)
}

// BenchmarkUpExecCLI runs the whole `stoke exec target -- true` process.
func BenchmarkUpExecCLI(b *testing.B) {
	s, _, _ := execTarget(b)
	call := func() {
		cmd := exec.Command(stokeBin, "exec", "target", "--", "true")
		cmd.Env = []string{"STOKE_SERVER=" + s.url, "STOKE_TOKEN=" + s.token, "HOME=" + b.TempDir()}
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("stoke exec: %v: %s", err, out)
		}
	}
	measureCalls(b, 5, call)
}

// patternReader gives n bytes of a fixed pattern without allocating.
type patternReader struct {
	block []byte
	left  int
}

func (r *patternReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.left)], r.block)
	r.left -= n
	return n, nil
}

type countWriter struct{ n int }

func (w *countWriter) Write(p []byte) (int, error) {
	w.n += len(p)
	return len(p), nil
}

// BenchmarkUpExecThroughput pipes 256 MiB through an exec'd cat without a
// TTY and reports MiB/s one way, how much the peak resident memory of this
// process — which is stoke up — grew, and the CPU time per MiB (one way,
// while as much goes the other) of this process (the client, the gateway
// and runtimed's hop) and of the Runtime Servers, which a loaded machine
// distorts less than the MiB/s.
func BenchmarkUpExecThroughput(b *testing.B) {
	const size = 256 << 20
	_, c, run := execTarget(b)
	x := c.Exec()
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
	rssBefore := statusKiB(b, "VmRSS")
	upCPU, podCPU := selfCPU(b), runtimeServersCPU(b)
	var elapsed time.Duration
	b.ResetTimer()
	for range b.N {
		in := &patternReader{block: bytes.Repeat([]byte("0123456789abcdef"), 4<<10), left: size}
		out := &countWriter{}
		start := time.Now()
		sess, err := x.Start(context.Background(), stokeexec.Request{RunUID: run, Command: []string{"cat"}, Stdin: true})
		if err != nil {
			b.Fatal(err)
		}
		exit, err := sess.Stream(context.Background(), stokeexec.Streams{Stdin: in, Stdout: out, Stderr: io.Discard})
		elapsed += time.Since(start)
		sess.Close()
		if err != nil || exit.Code != 0 || out.n != size {
			b.Fatalf("exit %+v, %v, %d bytes", exit, err, out.n)
		}
	}
	b.StopTimer()
	mib := float64(size*b.N) / (1 << 20)
	b.ReportMetric(mib/elapsed.Seconds(), "MiB/s")
	b.ReportMetric(float64(statusKiB(b, "VmHWM")-rssBefore)/1024, "rss-growth-MiB")
	b.ReportMetric(float64((selfCPU(b)-upCPU).Milliseconds())/mib, "up-cpu-ms/MiB")
	b.ReportMetric(float64((runtimeServersCPU(b)-podCPU).Milliseconds())/mib, "pod-cpu-ms/MiB")
	b.ReportMetric(0, "ns/op")
}

// selfCPU is this process's CPU time.
func selfCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runtimeServersCPU is the CPU time of this process's children that are
// Runtime Servers (the pods), from /proc in clock ticks (USER_HZ, 100).
func runtimeServersCPU(b *testing.B) time.Duration {
	tasks, err := filepath.Glob("/proc/self/task/*/children")
	if err != nil {
		b.Fatal(err)
	}
	var total time.Duration
	for _, t := range tasks {
		children, err := os.ReadFile(t)
		if err != nil {
			continue // the thread is gone
		}
		for _, pid := range strings.Fields(string(children)) {
			cmdline, err := os.ReadFile("/proc/" + pid + "/cmdline")
			if err != nil || !bytes.Contains(cmdline, []byte("runtime-server")) {
				continue
			}
			stat, err := os.ReadFile("/proc/" + pid + "/stat")
			if err != nil {
				continue
			}
			// The fields after the command's parenthesis: utime and
			// stime are the 12th and 13th.
			f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
			utime, _ := strconv.ParseInt(f[11], 10, 64)
			stime, _ := strconv.ParseInt(f[12], 10, 64)
			total += time.Duration(utime+stime) * 10 * time.Millisecond
		}
	}
	return total
}

func statusKiB(b *testing.B, field string) int {
	s, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(s), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return n
		}
	}
	b.Fatalf("no %s", field)
	return 0
}
