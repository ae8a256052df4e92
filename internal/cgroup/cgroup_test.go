package cgroup

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestCgroup2Mount(t *testing.T) {
	for _, tc := range []struct {
		name, mountinfo, want string
		err                   bool
	}{
		{name: "hybrid", mountinfo: `25 30 0:23 / /sys rw,nosuid shared:7 - sysfs sysfs rw
33 25 0:28 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
34 33 0:29 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
35 33 0:30 / /sys/fs/cgroup/systemd rw,nosuid shared:11 - cgroup cgroup rw,xattr,name=systemd
`, want: "/sys/fs/cgroup/unified"},
		{name: "unified", mountinfo: `30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`, want: "/sys/fs/cgroup"},
		{name: "escaped space", mountinfo: `30 24 0:26 / /mnt/my\040cg rw shared:4 - cgroup2 none rw
`, want: "/mnt/my cg"},
		{name: "read-only is skipped", mountinfo: `30 24 0:26 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 ro
`, err: true},
		{name: "subtree bind mount is skipped", mountinfo: `30 24 0:26 /user.slice /sys/fs/cgroup rw - cgroup2 cgroup2 rw
`, err: true},
		{name: "v1 only", mountinfo: `35 33 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
`, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Cgroup2Mount([]byte(tc.mountinfo))
			if tc.err {
				if err == nil {
					t.Fatalf("got %q, want an error", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestOwnPath(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		err      bool
	}{
		{in: "12:memory:/user.slice\n1:name=systemd:/init.scope\n0::/\n", want: "/"},
		{in: "0::/user.slice/user-0.slice/session-3.scope\n", want: "/user.slice/user-0.slice/session-3.scope"},
		{in: "12:memory:/\n1:name=systemd:/\n", err: true},
		{in: "0::/gone (deleted)\n", err: true},
		{in: "0::relative\n", err: true},
	} {
		got, err := OwnPath([]byte(tc.in))
		if tc.err != (err != nil) || got != tc.want {
			t.Errorf("OwnPath(%q) = %q, %v; want %q (error %v)", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestParseMode(t *testing.T) {
	for _, s := range []string{"auto", "subreaper"} {
		if m, err := ParseMode(s); err != nil || string(m) != s {
			t.Errorf("ParseMode(%q) = %q, %v", s, m, err)
		}
	}
	for _, s := range []string{"", "cgroup", "Auto"} {
		if _, err := ParseMode(s); err == nil {
			t.Errorf("ParseMode(%q): no error", s)
		}
	}
}

// A recorded path is acted on only strictly inside the group that would
// have made it: never the group itself, a sibling, a parent or a path
// that reaches out with "..".
func TestWithin(t *testing.T) {
	g := &Group{path: "/sys/fs/cgroup/unified/stoke-0123"}
	for _, ok := range []string{
		"/sys/fs/cgroup/unified/stoke-0123/pod-a",
		"/sys/fs/cgroup/unified/stoke-0123/pod-a/task_b",
	} {
		if c, err := g.Within(ok); err != nil || c.Path() != ok {
			t.Errorf("Within(%q) = %v, %v; want it accepted", ok, c, err)
		}
	}
	for _, bad := range []string{
		"/sys/fs/cgroup/unified/stoke-0123",
		"/sys/fs/cgroup/unified/stoke-0123/",
		"/sys/fs/cgroup/unified/stoke-01234/pod-a",
		"/sys/fs/cgroup/unified",
		"/sys/fs/cgroup/unified/stoke-0123/../other",
		"/sys/fs/cgroup/unified/stoke-0123/pod-a/../../other",
		"/sys/fs/cgroup/unified/stoke-0123/./pod-a",
		"stoke-0123/pod-a",
		"",
		"/",
	} {
		if c, err := g.Within(bad); err == nil {
			t.Errorf("Within(%q) = %v; want it refused", bad, c)
		}
	}
}

func TestChildRefusesNamesThatAreNotOneElement(t *testing.T) {
	g := &Group{path: t.TempDir()}
	for _, bad := range []string{"", ".", "..", "a/b", "../x", "a\x00b", "a\nb"} {
		if _, err := g.Child(bad); err == nil {
			t.Errorf("Child(%q): no error", bad)
		}
	}
	entries, err := os.ReadDir(g.path)
	if err != nil || len(entries) != 0 {
		t.Errorf("the refused names left %v (%v)", entries, err)
	}
}

// On a host that delegates a writable cgroup v2 (this machine's hybrid
// layout does, to root), Detect finds this process's group and leaves no
// probe; a child started into a child group with InCgroup's clone3 is
// there from its first instruction, and Remove kills it, and what it
// started in a session of its own, and removes the group.
func TestDetectAndRemove(t *testing.T) {
	own, err := Detect()
	if err != nil {
		t.Fatalf("this host delegates no usable cgroup v2 (the cgroup mode's tests need one): %v", err)
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	rel, _ := OwnPath(self)
	if !strings.HasSuffix(own.Path(), filepath.Clean(rel)) && rel != "/" {
		t.Errorf("Detect = %q, but /proc/self/cgroup says %q", own.Path(), rel)
	}
	if probes, _ := filepath.Glob(filepath.Join(own.Path(), "stoke-probe-*")); len(probes) > 0 {
		t.Errorf("probes left behind: %v", probes)
	}

	g, err := own.Child("stoke-test-" + filepath.Base(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Remove() })
	dir, err := g.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	// Through os/exec directly: internal/proc imports nothing of this
	// package, and InCgroup is its one use of the descriptor.
	cmd := exec.Command("sh", "-c", `setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!; exec sleep 300`)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(dir.Fd())}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 32)
	n, _ := out.Read(buf) // the escapee's pid, once it runs
	escapee := strings.TrimSpace(string(buf[:n]))
	if escapee == "" {
		t.Fatal("the shell printed no pid")
	}
	procs, err := os.ReadFile(filepath.Join(g.Path(), "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(procs), escapee) {
		t.Errorf("the escapee %s is not in the group: cgroup.procs %q", escapee, procs)
	}
	if pop, err := g.Populated(); err != nil || !pop {
		t.Errorf("Populated = %v, %v; want true", pop, err)
	}
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if _, err := os.Stat(g.Path()); !os.IsNotExist(err) {
		t.Errorf("the group is still there: %v", err)
	}
	if _, err := os.Stat("/proc/" + escapee); !os.IsNotExist(err) {
		if b, _ := os.ReadFile("/proc/" + escapee + "/stat"); !strings.Contains(string(b), ") Z ") {
			t.Errorf("the escapee %s still runs after Remove", escapee)
		}
	}
	// Removing what is gone is no error.
	if err := g.Remove(); err != nil {
		t.Errorf("second Remove: %v", err)
	}
}
