package pool

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"stoke.dev/stoke/internal/cgroup"
)

// A restarted supervisor kills and removes the cgroups its predecessor's
// pods recorded — everything in them, whatever session it made — but
// refuses a recorded path outside its own group.
func TestKillLeftoversRemovesRecordedCgroupsInsideItsOwnOnly(t *testing.T) {
	own, err := cgroup.Detect()
	if err != nil {
		t.Fatalf("this host delegates no usable cgroup v2 (the cgroup mode's tests need one): %v", err)
	}
	base, err := own.Child("stoke-pooltest-" + filepath.Base(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = base.Remove() })
	mine, err := base.Child("mine")
	if err != nil {
		t.Fatal(err)
	}
	outside, err := base.Child("outside")
	if err != nil {
		t.Fatal(err)
	}
	s := newIdleSupervisor(t)
	s.cfg.Cgroup = mine

	// An earlier pod's group, with a process that left its session.
	left, err := mine.Child("pod-earlier")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := left.Open()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "300")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, UseCgroupFD: true, CgroupFD: int(dir.Fd())}
	err = cmd.Start()
	dir.Close()
	if err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	record := func(pod, path string) {
		d := filepath.Join(s.podsDir, pod)
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, cgroupFile), []byte(path+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	record("earlier", left.Path())
	record("forged", outside.Path())
	record("climbing", mine.Path()+"/../outside")
	record("itself", mine.Path())
	s.killLeftovers()

	if err := <-exited; err == nil {
		t.Error("the earlier pod's process exited 0; want it killed")
	}
	if _, err := os.Stat(left.Path()); !os.IsNotExist(err) {
		t.Errorf("the earlier pod's cgroup is still there: %v", err)
	}
	for _, keep := range []string{outside.Path(), mine.Path()} {
		if _, err := os.Stat(keep); err != nil {
			t.Errorf("a refused record removed %s: %v", keep, err)
		}
	}
}
