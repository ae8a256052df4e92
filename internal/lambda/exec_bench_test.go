package lambda_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/runtime/runtimetest"
)

// execPeers are a task on Lambda, reached through its reverse agent, and
// the same task on a local bash Runtime Server, reached directly: each
// figure is measured on both in the same run.
func execPeers(b *testing.B) map[string]exec.Executor {
	b.Helper()
	e := start(b, "bash", bashTasks)
	local := runtimetest.StartServer(b, runtimetest.Harness{Runtime: "bash"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	peers := map[string]exec.Executor{}
	for name, rs := range map[string]*runtimetest.Server{"agent": e.rs, "local": local} {
		dir := rs.Dir(b, runtimetest.Source{Files: map[string]string{"task.sh": "sleep 600\n"}})
		if _, err := rs.Runtime.Execute(ctx, &pb.ExecuteRequest{Id: "bench-task", WorkingDir: dir, Entrypoint: "task.sh", TimeoutSeconds: 600}); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _, _ = rs.Runtime.Cancel(context.Background(), &pb.CancelRequest{Id: "bench-task"}) })
		x := exec.NewGRPCClient(rs.Conn)
		// Wait until the agent is there (a first exec works).
		for {
			_, _, _, err := collect(ctx, x, exec.Request{RunUID: "bench-task", Command: []string{"true"}})
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				b.Fatal(err)
			}
		}
		peers[name] = x
	}
	return peers
}

func collect(ctx context.Context, x exec.Executor, req exec.Request) (string, string, exec.Exit, error) {
	sess, err := x.Start(ctx, req)
	if err != nil {
		return "", "", exec.Exit{}, err
	}
	defer sess.Close()
	var out, errb strings.Builder
	exit, err := sess.Stream(ctx, exec.Streams{Stdout: &out, Stderr: &errb})
	return out.String(), errb.String(), exit, err
}

// BenchmarkExecAgentRoundTrip: one byte through an exec'd cat and back,
// over the reverse agent and into a local Run, interleaved; p50 of each.
func BenchmarkExecAgentRoundTrip(b *testing.B) {
	peers := execPeers(b)
	ctx := context.Background()
	type pipe struct {
		w   *io.PipeWriter
		out chan byte
		s   exec.Session
	}
	open := func(x exec.Executor) pipe {
		s, err := x.Start(ctx, exec.Request{RunUID: "bench-task", Command: []string{"cat"}, Stdin: true})
		if err != nil {
			b.Fatal(err)
		}
		r, w := io.Pipe()
		p := pipe{w: w, out: make(chan byte, 1), s: s}
		go func() { _, _ = s.Stream(ctx, exec.Streams{Stdin: r, Stdout: byteWriter(p.out), Stderr: io.Discard}) }()
		return p
	}
	pipes := map[string]pipe{"agent": open(peers["agent"]), "local": open(peers["local"])}
	defer func() {
		for _, p := range pipes {
			p.w.Close()
			p.s.Close()
		}
	}()
	times := map[string][]time.Duration{}
	b.ResetTimer()
	for range b.N {
		for _, name := range []string{"agent", "local"} {
			p := pipes[name]
			t0 := time.Now()
			if _, err := p.w.Write([]byte{'x'}); err != nil {
				b.Fatal(err)
			}
			<-p.out
			times[name] = append(times[name], time.Since(t0))
		}
	}
	b.StopTimer()
	for name, d := range times {
		b.ReportMetric(p50ms(d), name+"-p50-ms")
	}
}

type byteWriter chan byte

func (c byteWriter) Write(p []byte) (int, error) {
	for _, x := range p {
		c <- x
	}
	return len(p), nil
}

func p50ms(d []time.Duration) float64 {
	slices.Sort(d)
	return float64(d[len(d)/2].Microseconds()) / 1000
}

// BenchmarkExecAgentThroughput: 64 MiB each way through an exec'd cat
// without a TTY, over the reverse agent and into a local Run; MiB/s of
// each, and the Runtime Server's heap growth (the test process holds it)
// while the agent's stream runs.
func BenchmarkExecAgentThroughput(b *testing.B) {
	peers := execPeers(b)
	ctx := context.Background()
	const size = 64 << 20
	data := make([]byte, 1<<20)
	_, _ = rand.Read(data)
	rates := map[string][]float64{}
	var peak uint64
	for range b.N {
		for _, name := range []string{"agent", "local"} {
			s, err := peers[name].Start(ctx, exec.Request{RunUID: "bench-task", Command: []string{"cat"}, Stdin: true})
			if err != nil {
				b.Fatal(err)
			}
			r, w := io.Pipe()
			go func() {
				for n := 0; n < size; n += len(data) {
					if _, err := w.Write(data); err != nil {
						return
					}
				}
				w.Close()
			}()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			base := ms.HeapInuse
			var mu sync.Mutex
			n := 0
			stop := make(chan struct{})
			go func() { // samples the heap as the bytes flow
				t := time.NewTicker(20 * time.Millisecond)
				defer t.Stop()
				for {
					select {
					case <-stop:
						return
					case <-t.C:
						var m runtime.MemStats
						runtime.ReadMemStats(&m)
						mu.Lock()
						if m.HeapInuse > base && m.HeapInuse-base > peak {
							peak = m.HeapInuse - base
						}
						mu.Unlock()
					}
				}
			}()
			t0 := time.Now()
			exit, err := s.Stream(ctx, exec.Streams{Stdin: r, Stdout: countWriter{&n}, Stderr: io.Discard})
			el := time.Since(t0)
			close(stop)
			s.Close()
			if err != nil || exit.Code != 0 || n != size {
				b.Fatalf("%s: %d of %d bytes, exit %+v, %v", name, n, size, exit, err)
			}
			rates[name] = append(rates[name], float64(size)/(1<<20)/el.Seconds())
		}
	}
	for name, r := range rates {
		slices.Sort(r)
		b.ReportMetric(r[len(r)/2], name+"-MiB/s")
	}
	b.ReportMetric(float64(peak)/(1<<20), "heap-growth-MiB")
}

type countWriter struct{ n *int }

func (c countWriter) Write(p []byte) (int, error) { *c.n += len(p); return len(p), nil }

// BenchmarkTaskStartToAgent: from the task's invocation to its agent being
// connected (tasks that sleep), beside a whole no-op task's invocation
// (its own start and end) on the same server; and from the sandbox's
// receipt of the invocation (the bootstrap's next answered) to the agent's
// hello over its connection, as the agent measures it; p50 of each.
func BenchmarkTaskStartToAgent(b *testing.B) {
	var mu sync.Mutex
	steps := map[string][]time.Duration{}
	e := start(b, "bash", bashTasks, func(step string, d time.Duration) {
		mu.Lock()
		steps[step] = append(steps[step], d)
		mu.Unlock()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var agentUp, inSandbox, noop []time.Duration
	for i := range b.N {
		for _, script := range []string{"sleep 0.5\n", "true\n"} {
			mu.Lock()
			clear(steps)
			mu.Unlock()
			dir := e.rs.Dir(b, runtimetest.Source{Files: map[string]string{"task.sh": script}})
			id := fmt.Sprintf("bench-%d-%d", i, len(script))
			if _, err := e.rs.Runtime.Execute(ctx, &pb.ExecuteRequest{Id: id, WorkingDir: dir, Entrypoint: "task.sh", TimeoutSeconds: 60}); err != nil {
				b.Fatal(err)
			}
			if _, err := e.rs.Runtime.Wait(ctx, &pb.StatusRequest{Id: id}); err != nil {
				b.Fatal(err)
			}
			mu.Lock()
			if script == "true\n" {
				noop = append(noop, steps["task"]...)
			} else {
				agentUp = append(agentUp, steps["agent"]...)
				inSandbox = append(inSandbox, steps["agent-in-sandbox"]...)
			}
			mu.Unlock()
		}
	}
	b.StopTimer()
	if len(agentUp) == 0 || len(noop) == 0 {
		b.Fatalf("observed %d agent connections, %d no-op tasks", len(agentUp), len(noop))
	}
	b.ReportMetric(p50ms(agentUp), "agent-connected-p50-ms")
	b.ReportMetric(p50ms(noop), "noop-task-invocation-p50-ms")
	if len(inSandbox) > 0 {
		b.ReportMetric(p50ms(inSandbox), "agent-after-invocation-received-p50-ms")
	}
}
