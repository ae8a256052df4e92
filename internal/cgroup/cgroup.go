// Package cgroup puts the processes Stoke starts in cgroup v2 groups of
// their own, where the host lets this process create them, so that every
// descendant — whatever it does to leave its session or its parent — can
// be found and killed at once with cgroup.kill. Where no writable cgroup
// v2 with cgroup.kill is delegated, Detect says so and callers fall back to
// the child subreaper (internal/proc).
package cgroup

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Mode selects how Stoke contains what a Run starts.
type Mode string

const (
	// Auto uses a cgroup v2 of its own where the host delegates one, and
	// the child subreaper as well (and alone where it does not).
	Auto Mode = "auto"
	// Subreaper uses the child subreaper alone.
	Subreaper Mode = "subreaper"
)

// ParseMode checks a --containment value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case Auto, Subreaper:
		return m, nil
	}
	return "", fmt.Errorf("containment %q: want %q or %q", s, Auto, Subreaper)
}

// Group is one cgroup v2 directory.
type Group struct{ path string }

// Path is the group's directory under the cgroup2 mount.
func (g *Group) Path() string { return g.path }

// Detect finds this process's own cgroup v2 and checks that it is usable:
// a child group can be created in it and has cgroup.kill. It returns why
// not otherwise, and never leaves the probe behind.
func Detect() (*Group, error) {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	mnt, err := Cgroup2Mount(mi)
	if err != nil {
		return nil, err
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	rel, err := OwnPath(self)
	if err != nil {
		return nil, err
	}
	own := &Group{path: filepath.Join(mnt, rel)}
	probe, err := own.Child(fmt.Sprintf("stoke-probe-%d", os.Getpid()))
	if err != nil {
		return nil, fmt.Errorf("cgroup %s is not writable: %w", own.path, err)
	}
	defer func() { _ = os.Remove(probe.path) }()
	if _, err := os.Stat(filepath.Join(probe.path, "cgroup.kill")); err != nil {
		return nil, fmt.Errorf("cgroup %s has no cgroup.kill (kernel before 5.14): %w", own.path, err)
	}
	return own, nil
}

// Cgroup2Mount returns the mount point of the cgroup2 file system in a
// /proc/PID/mountinfo text: on a unified host /sys/fs/cgroup, on a hybrid
// one often /sys/fs/cgroup/unified.
func Cgroup2Mount(mountinfo []byte) (string, error) {
	sc := bufio.NewScanner(bytes.NewReader(mountinfo))
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		pf, sf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(sf) < 1 || sf[0] != "cgroup2" {
			continue
		}
		if pf[3] != "/" {
			continue // a bind mount of a subtree: paths in /proc/self/cgroup are not relative to it
		}
		if hasOpt(pf[5], "ro") {
			continue
		}
		return unescapeMount(pf[4]), nil
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", errors.New("no cgroup2 file system is mounted read-write")
}

func hasOpt(opts, o string) bool {
	for _, x := range strings.Split(opts, ",") {
		if x == o {
			return true
		}
	}
	return false
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range []byte(s[i+1 : i+4]) {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + c - '0'
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// OwnPath returns the cgroup v2 path (the "0::" line) of a
// /proc/PID/cgroup text.
func OwnPath(procCgroup []byte) (string, error) {
	for line := range strings.SplitSeq(string(procCgroup), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			if !strings.HasPrefix(p, "/") || strings.Contains(p, " (deleted)") {
				return "", fmt.Errorf("cgroup v2 path %q is not usable", p)
			}
			return filepath.Clean(p), nil
		}
	}
	return "", errors.New("this process is in no cgroup v2 hierarchy")
}

// Child creates (or finds) the child group name of g. name is one path
// element.
func (g *Group) Child(name string) (*Group, error) {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00\n") {
		return nil, fmt.Errorf("cgroup name %q is not one path element", name)
	}
	c := &Group{path: filepath.Join(g.path, name)}
	if err := os.Mkdir(c.path, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	return c, nil
}

// Open returns the group's directory, whose descriptor starts a child
// directly in the group (proc.InCgroup: clone3 with CLONE_INTO_CGROUP, so
// the child is never outside it). The caller closes it once the child has
// started.
func (g *Group) Open() (*os.File, error) {
	return os.OpenFile(g.path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
}

// Within returns the group at path if path lies strictly inside g (a
// recorded path is acted on only if it is a descendant of the group that
// would have created it), an error otherwise.
func (g *Group) Within(path string) (*Group, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("cgroup %q is not an absolute path", path)
	}
	clean := filepath.Clean(path)
	rel, err := filepath.Rel(g.path, clean)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") || clean != path {
		return nil, fmt.Errorf("cgroup %q is not inside %s", path, g.path)
	}
	return &Group{path: clean}, nil
}

// removeBound bounds how long Remove waits for the killed processes to
// leave the group.
const removeBound = 5 * time.Second

// Remove kills every process in the group and its descendants
// (cgroup.kill), waits until they are gone and removes the group's
// directories. A group that does not exist is no error.
func (g *Group) Remove() error {
	err := os.WriteFile(filepath.Join(g.path, "cgroup.kill"), []byte("1"), 0)
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(g.path); errors.Is(serr, fs.ErrNotExist) {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("cgroup %s: kill: %w", g.path, err)
	}
	deadline := time.Now().Add(removeBound)
	delay := time.Millisecond
	for {
		err := removeTree(g.path)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: remove: %w", g.path, err)
		}
		// Polling: killed processes leave the group asynchronously; the
		// kernel's notice (cgroup.events) is not worth a watcher here.
		time.Sleep(delay)
		delay = min(2*delay, 20*time.Millisecond)
	}
}

// removeTree removes dir's child groups, deepest first, then dir.
func removeTree(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := removeTree(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}

// Populated reports whether any process is in the group or below it.
func (g *Group) Populated() (bool, error) {
	f, err := os.Open(filepath.Join(g.path, "cgroup.events"))
	if err != nil {
		return false, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return false, err
	}
	return bytes.Contains(b, []byte("populated 1")), nil
}
