package python

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"stoke.dev/stoke/internal/runtime"
)

// A call's children die when it returns, whatever they are: ones that
// forked without exec, whose environment is the worker's rather than the
// call's, and ones in the middle of a chain of execs, each in a session of
// its own; what the module started when it was imported lives on.
func TestInvokeKillsWhatTheCallStarted(t *testing.T) {
	inst, _ := loadHandler(t, map[string]string{"m.py": `import os, subprocess, time

keeper = subprocess.Popen(["sleep", "1000"])
CHAIN = 'i=$1; [ "$i" -gt 0 ] && exec sh -c "$CHAIN" chain $((i-1)); exec sleep 1000'

def handle(event):
    pids = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
                time.sleep(1000)
            finally:
                os._exit(0)
        pids.append(pid)
    for _ in range(4):
        p = subprocess.Popen(["sh", "-c", CHAIN, "chain", "100"], env=dict(os.environ, CHAIN=CHAIN),
                             start_new_session=True)
        pids.append(p.pid)
    return {"pids": pids, "keeper": keeper.pid}
`}, "m.handle")
	for call := range 3 {
		id := "call-" + strconv.Itoa(call)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		deadline, _ := ctx.Deadline()
		res, err := inst.Invoke(ctx, runtime.Invocation{ID: id, RunUID: "run-test", Input: []byte(`{}`), Deadline: deadline,
			Scope: "reg.scope." + strconv.Itoa(call)})
		cancel()
		inst.Finish() // as the core does once the answer is sent
		if err != nil {
			t.Fatal(err)
		}
		var out struct {
			Pids   []int `json:"pids"`
			Keeper int   `json:"keeper"`
		}
		if err := json.Unmarshal(res.Output, &out); err != nil || len(out.Pids) != 8 {
			t.Fatalf("output %s: %v", res.Output, err)
		}
		for _, pid := range out.Pids {
			waitGone(t, pid, 10*time.Second)
		}
		if !runs(out.Keeper) {
			t.Fatalf("call %d: the process the module started at import (%d) was killed", call, out.Keeper)
		}
	}
}

// runs reports whether pid exists and is not a zombie.
func runs(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}
