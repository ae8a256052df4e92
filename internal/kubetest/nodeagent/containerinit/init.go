package containerinit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Main runs the init: it returns the exit status for os.Exit. Errors
// before the command starts go to stderr (the container's log) with
// status 128, which the agent reports as a failed start.
func Main() int {
	spec, err := readSpec()
	if err == nil {
		err = setUp(spec)
	}
	var ln net.Listener
	if err == nil {
		// Listen before the pivot: the socket's path is the agent's.
		ln, err = net.Listen("unix", spec.ExecSocket)
	}
	if err == nil {
		err = pivot(spec.Root)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "stoke-container-init: %v\n", err)
		return 128
	}
	return run(spec, ln)
}

func readSpec() (*Spec, error) {
	f := os.NewFile(3, "spec")
	if f == nil {
		return nil, errors.New("no spec on file descriptor 3")
	}
	defer f.Close()
	var s Spec
	if err := json.NewDecoder(io.LimitReader(f, 1<<20)).Decode(&s); err != nil {
		return nil, fmt.Errorf("read spec: %w", err)
	}
	if len(s.Argv) == 0 || s.Root == "" || s.ExecSocket == "" {
		return nil, errors.New("spec: argv, root and execSocket are required")
	}
	return &s, nil
}

// setUp builds the container's root in spec.Root: a tmpfs holding a
// recursive bind of each of the host's top-level entries (the host's file
// system as it is: no image), a fresh /proc for the new PID namespace,
// and the mounts.
func setUp(s *Spec) error {
	if s.Hostname != "" {
		if err := unix.Sethostname([]byte(s.Hostname)); err != nil {
			return fmt.Errorf("sethostname: %w", err)
		}
	}
	// Nothing mounted from here on may reach the host's namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	root := s.Root
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mount the root tmpfs: %w", err)
	}
	b := &builder{root: root, owned: map[string]bool{root: true}}
	entries, err := os.ReadDir("/")
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Name() == "proc" {
			continue
		}
		if err := b.copyEntry("/", e.Name(), root); err != nil {
			return err
		}
	}
	if err := os.Mkdir(filepath.Join(root, "proc"), 0o555); err != nil {
		return err
	}
	if err := unix.Mount("proc", filepath.Join(root, "proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	for _, m := range s.Mounts {
		if err := b.bind(m); err != nil {
			return fmt.Errorf("mount %s at %s: %w", m.Source, m.Target, err)
		}
	}
	return nil
}

// builder creates mount points in the new root. A directory in owned is on
// one of the init's tmpfs mounts (or a writable volume): creating an entry
// there touches nothing of the host's. Any other directory is the host's,
// seen through a bind: before creating an entry in it, the builder
// replaces it (in this mount namespace only) with a tmpfs holding binds of
// its entries, as snap's "mimic" does.
type builder struct {
	root  string
	owned map[string]bool
}

// copyEntry recreates dir/name at into/name: a directory or file as a
// recursive bind, a symlink as a copy.
func (b *builder) copyEntry(dir, name, into string) error {
	src, dst := filepath.Join(dir, name), filepath.Join(into, name)
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil // gone meanwhile
		}
		return fmt.Errorf("lstat %s: %w", src, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(target, dst)
	case unix.S_IFDIR:
		if err := os.Mkdir(dst, os.FileMode(st.Mode&0o7777)); err != nil {
			return err
		}
	default:
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		f.Close()
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	return nil
}

// bind binds m.Source at m.Target inside the root.
func (b *builder) bind(m Mount) error {
	fi, err := os.Stat(m.Source)
	if err != nil {
		return err
	}
	dst, err := b.ensure(m.Target, fi.IsDir())
	if err != nil {
		return err
	}
	if err := unix.Mount(m.Source, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	if m.ReadOnly {
		if err := unix.Mount("", dst, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("remount read-only: %w", err)
		}
	} else if fi.IsDir() {
		b.owned[dst] = true // a volume: the Pod's own, not the host's
	}
	return nil
}

// ensure returns the host path of target inside the root, creating it
// (a directory, or an empty file when !dir) if it is missing. Symlinks on
// the way resolve inside the root, as the runtime's securejoin does.
func (b *builder) ensure(target string, dir bool) (string, error) {
	rest := splitPath(target)
	cur := b.root
	for hops := 0; len(rest) > 0; {
		name := rest[0]
		next := filepath.Join(cur, name)
		var st unix.Stat_t
		err := unix.Lstat(next, &st)
		switch {
		case err == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK:
			if hops++; hops > 40 {
				return "", fmt.Errorf("%s: too many symlinks", target)
			}
			link, err := os.Readlink(next)
			if err != nil {
				return "", err
			}
			if filepath.IsAbs(link) {
				cur = b.root
			}
			rest = append(splitPath(link), rest[1:]...)
			continue
		case err == nil && len(rest) == 1:
			return next, nil
		case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
			if name == ".." {
				if cur != b.root {
					cur = filepath.Dir(cur)
				}
			} else {
				cur = next
			}
			rest = rest[1:]
			continue
		case err == nil:
			return "", fmt.Errorf("%s: %s is not a directory", target, next)
		case !errors.Is(err, unix.ENOENT):
			return "", err
		}
		if !b.owned[cur] {
			if err := b.mimic(cur); err != nil {
				return "", err
			}
		}
		if len(rest) == 1 && !dir {
			f, err := os.OpenFile(next, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return "", err
			}
			f.Close()
			return next, nil
		}
		if err := os.Mkdir(next, 0o755); err != nil {
			return "", err
		}
		b.owned[next] = true
		cur, rest = next, rest[1:]
	}
	return cur, nil
}

// mimic replaces dir, in this mount namespace, with a tmpfs that holds
// its entries (binds and symlink copies), so that new entries can be made
// there without writing to the host.
func (b *builder) mimic(dir string) error {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	// The old directory stays reachable through this descriptor once the
	// tmpfs covers it.
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("mode=%o", st.Mode&0o7777)); err != nil {
		return fmt.Errorf("mimic %s: %w", dir, err)
	}
	old := fmt.Sprintf("/proc/self/fd/%d", fd)
	for _, e := range entries {
		if err := b.copyEntry(old, e.Name(), dir); err != nil {
			return fmt.Errorf("mimic %s: %w", dir, err)
		}
	}
	b.owned[dir] = true
	return nil
}

func splitPath(p string) []string {
	var out []string
	for _, s := range strings.Split(p, "/") {
		if s != "" && s != "." {
			out = append(out, s)
		}
	}
	return out
}

// pivot makes root the root of this mount namespace and drops the old one.
func pivot(root string) error {
	old := filepath.Join(root, ".oldroot")
	if err := os.Mkdir(old, 0o700); err != nil {
		return err
	}
	if err := unix.PivotRoot(root, old); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := unix.Unmount("/.oldroot", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount the old root: %w", err)
	}
	return os.Remove("/.oldroot")
}

// reaper is PID 1's wait loop: it reaps every child (the command, exec
// requests, and orphans the kernel hands to PID 1) and hands each watched
// child's status to its waiter. A child is watched from before its fork
// (start holds mu across it), so its exit cannot be reaped unnoticed.
type reaper struct {
	mu      sync.Mutex
	watched map[int]chan unix.WaitStatus
}

func (r *reaper) start(path string, argv, env []string, dir string, files []*os.File, sys *syscall.SysProcAttr) (*os.Process, chan unix.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, err := os.StartProcess(path, argv, &os.ProcAttr{Dir: dir, Env: env, Files: files, Sys: sys})
	if err != nil {
		return nil, nil, err
	}
	ch := make(chan unix.WaitStatus, 1)
	r.watched[p.Pid] = ch
	return p, ch, nil
}

// reap collects every child that has exited.
func (r *reaper) reap() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		r.mu.Lock()
		if ch, ok := r.watched[pid]; ok {
			ch <- ws
			delete(r.watched, pid)
		}
		r.mu.Unlock()
	}
}

func exitCode(ws unix.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// run starts the command and is PID 1 until it exits.
func run(s *Spec, ln net.Listener) int {
	r := &reaper{watched: map[int]chan unix.WaitStatus{}}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs)
	dir := s.Dir
	if dir == "" {
		dir = "/"
	}
	path, err := lookPath(s.Argv[0], s.Env)
	if err != nil {
		fmt.Fprintf(os.Stderr, "stoke-container-init: %v\n", err)
		return 128
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		fmt.Fprintf(os.Stderr, "stoke-container-init: %v\n", err)
		return 128
	}
	main, done, err := r.start(path, s.Argv, s.Env, dir, []*os.File{devnull, os.Stdout, os.Stderr}, nil)
	devnull.Close()
	if err != nil {
		fmt.Fprintf(os.Stderr, "stoke-container-init: start %q: %v\n", s.Argv[0], err)
		return 128
	}
	go serveExec(ln, r, s, dir)
	for {
		select {
		case ws := <-done:
			return exitCode(ws)
		case sig := <-sigs:
			switch sig {
			case unix.SIGCHLD:
				r.reap()
			case unix.SIGURG, unix.SIGPIPE, unix.SIGWINCH:
				// The Go runtime's preemption signal, and ones not meant for the command.
			default:
				_ = main.Signal(sig)
			}
		}
	}
}

// lookPath resolves name as execvp would with env's PATH.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q: executable file not found in $PATH", name)
}

func serveExec(ln net.Listener, r *reaper, s *Spec, dir string) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		go handleExec(conn, r, s, dir)
	}
}

func handleExec(conn net.Conn, r *reaper, s *Spec, dir string) {
	defer conn.Close()
	var req ExecRequest
	if err := json.NewDecoder(io.LimitReader(conn, maxRequest)).Decode(&req); err != nil {
		return
	}
	res := execute(req, r, s, dir)
	_ = json.NewEncoder(conn).Encode(res)
}

func execute(req ExecRequest, r *reaper, s *Spec, dir string) ExecResult {
	if len(req.Argv) == 0 {
		return ExecResult{ExitCode: -1, Error: "empty command"}
	}
	path, err := lookPath(req.Argv[0], s.Env)
	if err != nil {
		return ExecResult{ExitCode: -1, Error: err.Error()}
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return ExecResult{ExitCode: -1, Error: err.Error()}
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		pr.Close()
		pw.Close()
		return ExecResult{ExitCode: -1, Error: err.Error()}
	}
	p, done, err := r.start(path, req.Argv, s.Env, dir, []*os.File{devnull, pw, pw}, &syscall.SysProcAttr{Setpgid: true})
	devnull.Close()
	pw.Close()
	if err != nil {
		pr.Close()
		return ExecResult{ExitCode: -1, Error: err.Error()}
	}
	out := make(chan string, 1)
	go func() {
		head, _ := io.ReadAll(io.LimitReader(pr, maxOutput))
		_, _ = io.Copy(io.Discard, pr)
		pr.Close()
		out <- string(head)
	}()
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = time.Second
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	var res ExecResult
	select {
	case ws := <-done:
		res.ExitCode = exitCode(ws)
	case <-t.C:
		_ = unix.Kill(-p.Pid, unix.SIGKILL)
		res.ExitCode = exitCode(<-done)
		res.TimedOut = true
		res.Error = fmt.Sprintf("command timed out after %v", timeout)
	}
	// Whatever the command left running in its group must not hold the
	// pipe open.
	_ = unix.Kill(-p.Pid, unix.SIGKILL)
	res.Output = <-out
	return res
}
