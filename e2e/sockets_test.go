package e2e

import (
	"bufio"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/datadir"
	"stoke.dev/stoke/internal/pool"
)

// A `stoke up` with a running task and Ready Bash and Python functions
// (each invoked once) opens no socket that another local user could use:
// its only TCP listener is the gateway, which refuses a request without
// the token; every Unix socket it listens on lies in a directory of mode
// 0700 owned by this user and is one of those it knows (its debug and
// Docker API sockets, each pod's Runtime Server and debug sockets); it has no UDP socket. No process of its tree
// shows a Run UID or the token in its arguments (/proc/PID/cmdline is
// readable by every user).
func TestUpOpensNoUnauthenticatedSocket(t *testing.T) {
	dir := t.TempDir()
	u := startUp(t, dir)
	w := u.watchRuns(t)

	uids := map[string]string{} // Run UID → name
	task := u.createRun(t, newRun("sleeper", v1alpha1.RunSpec{Runtime: "bash",
		Mode: v1alpha1.RunMode{Task: &v1alpha1.TaskMode{Args: []string{"sleep", "301"}}}}))
	uids[string(task.UID)] = task.Name
	for _, fn := range []*v1alpha1.Run{
		newRun("bashfn", v1alpha1.RunSpec{Runtime: "bash",
			Mode:   v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "h.handle"}},
			Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "h.sh", Text: "handle() { printf '%s' \"$1\"; }\n"}}}),
		newRun("pyfn", v1alpha1.RunSpec{Runtime: "python",
			Mode:   v1alpha1.RunMode{Function: &v1alpha1.FunctionMode{Handler: "m.handle"}},
			Source: &v1alpha1.Source{Inline: &v1alpha1.InlineSource{Path: "m.py", Text: "def handle(event):\n    return event\n"}}}),
	} {
		created := u.createRun(t, fn)
		uids[string(created.UID)] = created.Name
	}
	runs := w.until(t, 60*time.Second, "the functions Ready and the task Running", func(runs map[string]*v1alpha1.Run) bool {
		for _, name := range uids {
			r := runs[name]
			want := v1alpha1.PhaseReady
			if name == "sleeper" {
				want = v1alpha1.PhaseRunning
			}
			if r == nil || r.Status.Phase != want && !r.Status.Phase.Terminal() {
				return false
			}
		}
		return true // a terminal one fails below
	})
	if r := runs["sleeper"]; r.Status.Phase != v1alpha1.PhaseRunning {
		t.Fatalf("sleeper is %s (%s: %s), want Running", r.Status.Phase, r.Status.Reason, r.Status.Message)
	}
	client := &http.Client{Timeout: 30 * time.Second}
	for _, name := range []string{"bashfn", "pyfn"} {
		r := runs[name]
		if r.Status.Phase != v1alpha1.PhaseReady {
			t.Fatalf("%s is %s (%s: %s), want Ready", name, r.Status.Phase, r.Status.Reason, r.Status.Message)
		}
		if res := invokeEndpoint(client, u.Token, r.Status.Endpoint, `{"a":1}`); res.err != nil || res.status != http.StatusOK {
			t.Fatalf("invoke %s: %d %s %v", name, res.status, res.body, res.err)
		}
		// Without the token the gateway refuses.
		if res := invokeEndpoint(client, "", r.Status.Endpoint, `{"a":1}`); res.err != nil || res.status != http.StatusUnauthorized {
			t.Fatalf("invoke %s without the token: %d %s %v, want 401", name, res.status, res.body, res.err)
		}
	}
	if !awaitProcess(10*time.Second, func() bool {
		for _, p := range descendants(u.Pid) {
			if strings.Join(p.cmdline, " ") == "sleep 301" {
				return true
			}
		}
		return false
	}) {
		t.Fatalf("the task's sleep 301 never ran under stoke up:\n%s", describeProcesses(descendants(u.Pid)))
	}

	tree := append([]process{{pid: u.Pid}}, descendants(u.Pid)...)
	inodes := map[uint64]int{} // socket inode → a pid holding it
	for _, p := range tree {
		for _, ino := range socketInodes(p.pid) {
			inodes[ino] = p.pid
		}
	}
	gw, err := url.Parse(u.URL)
	if err != nil {
		t.Fatal(err)
	}
	gwPort, _ := strconv.Atoi(gw.Port())
	for _, file := range []string{"tcp", "tcp6"} {
		for _, s := range readInetSockets(t, u.Pid, file) {
			pid, ours := inodes[s.inode]
			if !ours || s.state != tcpListen {
				continue
			}
			if s.port != gwPort {
				t.Errorf("pid %d listens on %s port %d, which is not the gateway's (%d)", pid, file, s.port, gwPort)
			}
		}
	}
	for _, file := range []string{"udp", "udp6"} {
		for _, s := range readInetSockets(t, u.Pid, file) {
			if pid, ours := inodes[s.inode]; ours {
				t.Errorf("pid %d has a %s socket on port %d", pid, file, s.port)
			}
		}
	}
	listening := map[string]int{} // path → a pid listening on it
	for _, s := range readUnixSockets(t) {
		pid, ours := inodes[s.inode]
		if !ours || !s.listening {
			continue
		}
		listening[s.path] = pid
		if s.path == "" || strings.HasPrefix(s.path, "@") {
			t.Errorf("pid %d listens on an unnamed or abstract Unix socket %q", pid, s.path)
			continue
		}
		d := filepath.Dir(s.path)
		fi, err := os.Stat(d)
		if err != nil {
			t.Errorf("pid %d listens on %s: %v", pid, s.path, err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().Perm() != 0o700 || int(st.Uid) != os.Getuid() {
			t.Errorf("pid %d listens on %s in a directory of mode %v owned by uid %d, want 0700 owned by %d",
				pid, s.path, fi.Mode().Perm(), st.Uid, os.Getuid())
		}
	}
	if len(listening) == 0 {
		t.Errorf("no listening Unix socket found in the tree: the pods serve on Unix sockets, so the scan is broken")
	}
	// Each is one Stoke knows of: stoke up's debug and Docker API
	// sockets, and each pod's Runtime Server and debug sockets, which the
	// scan above must have seen.
	debugSock, dockerSock := datadir.DebugSocket(dir), datadir.DockerSocket(dir)
	for _, sock := range []string{debugSock, dockerSock} {
		if _, ok := listening[sock]; !ok {
			t.Errorf("stoke up's socket %s is not among the sockets its tree listens on", sock)
		}
	}
	pods := 0
	for path, pid := range listening {
		if path == debugSock || path == dockerSock {
			continue
		}
		rel, err := filepath.Rel(filepath.Join(dir, "pods"), path)
		pod, name, _ := strings.Cut(rel, "/")
		switch {
		case err != nil || strings.HasPrefix(rel, "..") || strings.Contains(name, "/"):
			t.Errorf("pid %d listens on %s, which is neither stoke up's debug socket nor a pod's socket", pid, path)
		case name == "rs.sock":
			pods++
			if _, ok := listening[filepath.Join(dir, "pods", pod, pool.DebugSocketName)]; !ok {
				t.Errorf("pod %s serves its Runtime Server but no debug socket", pod)
			}
		case name != pool.DebugSocketName:
			t.Errorf("pid %d listens on %s, which is neither a pod's Runtime Server nor its debug socket", pid, path)
		}
	}
	if pods == 0 {
		t.Errorf("no pod's Runtime Server socket among %v", listening)
	}

	for _, p := range tree {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.pid))
		if err != nil {
			continue // exited meanwhile
		}
		args := string(b)
		for uid, name := range uids {
			if strings.Contains(args, uid) {
				t.Errorf("pid %d shows the UID of Run %s in its arguments: %q", p.pid, name, shorten(strings.Split(args, "\x00")))
			}
		}
		if strings.Contains(args, u.Token) {
			t.Errorf("pid %d shows the API token in its arguments", p.pid)
		}
	}
	w.stop()
	u.stop(t)
}

// shorten cuts each argument to 200 bytes, for a readable message.
func shorten(args []string) []string {
	for i, a := range args {
		if len(a) > 200 {
			args[i] = a[:200] + "…"
		}
	}
	return args
}

// socketInodes returns the inodes of the sockets pid holds open.
func socketInodes(pid int) []uint64 {
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		return nil // exited meanwhile
	}
	var out []uint64
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err != nil {
			continue
		}
		if s, ok := strings.CutPrefix(target, "socket:["); ok {
			if ino, err := strconv.ParseUint(strings.TrimSuffix(s, "]"), 10, 64); err == nil {
				out = append(out, ino)
			}
		}
	}
	return out
}

// tcpListen is the state of a listening socket in /proc/net/tcp.
const tcpListen = 0x0A

// inetSocket is one line of /proc/PID/net/{tcp,tcp6,udp,udp6}.
type inetSocket struct {
	port  int
	state int
	inode uint64
}

// readInetSockets reads /proc/PID/net/FILE: the sockets of pid's network
// namespace ("sl local_address rem_address st tx:rx tr:when retrnsmt uid
// timeout inode ...", the address as HEX_IP:HEX_PORT).
func readInetSockets(t *testing.T, pid int, file string) []inetSocket {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []inetSocket
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fld := strings.Fields(sc.Text())
		if len(fld) < 10 {
			continue
		}
		_, hexPort, _ := strings.Cut(fld[1], ":")
		port, err1 := strconv.ParseInt(hexPort, 16, 32)
		state, err2 := strconv.ParseInt(fld[3], 16, 32)
		ino, err3 := strconv.ParseUint(fld[9], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			t.Fatalf("/proc/%d/net/%s: cannot parse %q", pid, file, sc.Text())
		}
		out = append(out, inetSocket{port: int(port), state: int(state), inode: ino})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// unixSocket is one line of /proc/net/unix.
type unixSocket struct {
	inode     uint64
	listening bool
	path      string
}

// soAcceptCon is the flag of a listening socket in /proc/net/unix.
const soAcceptCon = 0x10000

// readUnixSockets reads /proc/net/unix ("Num RefCount Protocol Flags Type
// St Inode Path").
func readUnixSockets(t *testing.T) []unixSocket {
	t.Helper()
	f, err := os.Open("/proc/net/unix")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []unixSocket
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fld := strings.Fields(sc.Text())
		if len(fld) < 7 {
			continue
		}
		flags, err1 := strconv.ParseUint(fld[3], 16, 32)
		ino, err2 := strconv.ParseUint(fld[6], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("/proc/net/unix: cannot parse %q", sc.Text())
		}
		s := unixSocket{inode: ino, listening: flags&soAcceptCon != 0}
		if len(fld) > 7 {
			s.path = fld[7]
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
