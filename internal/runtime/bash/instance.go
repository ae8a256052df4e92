package bash

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"stoke.dev/stoke/internal/proc"
	"stoke.dev/stoke/internal/runtime"
	"stoke.dev/stoke/internal/runuser"
)

// instance is one warm shell: a runtime.Instance.
type instance struct {
	log   *slog.Logger   // spec.Logger: events
	out   runtime.Output // spec.Output: the handler's stderr
	grace time.Duration
	proc  *proc.Process
	// marker is "\x1e<nonce> ", which starts the trailer a child writes
	// after the function's stdout and the sync markers on stderr.
	marker []byte
	ctl    *os.File // control pipe, write end: one request number per request
	status *os.File // status pipe, read end
	stderr *os.File // stderr of the warm shell and every child, read end
	// statusW and stderrW are write ends of Go's own, for the sync lines
	// that tell when a reader has read everything written before them.
	statusW *os.File
	stderrW *os.File
	// scratch is this instance's own directory inside spec.ScratchDir (a
	// replacement instance gets another), holding req.N, out.N and
	// outputs.N; dirfd is it opened, for lookups that do not walk the path.
	scratch string
	dirfd   int
	// user is spec.User, to whom each request's files are handed.
	user *runuser.User

	// The status reader and the stderr pump stop at end-of-file, which
	// Close forces after a grace period.
	statusDone chan struct{}
	pumpDone   chan struct{}
	// dead is cancelled when the warm shell has exited, by a goroutine
	// that ends then (deadDone); it wakes an invocation reading stdout.
	dead     context.Context
	deadDone chan struct{}

	initDone chan struct{} // closed by the status reader at "ready" or "init …"
	initMsg  string        // valid once initDone is closed
	initTail tail          // stderr outside invocations

	mu     sync.Mutex
	cur    *child // the newest child announced that has not ended
	active *call  // the invocation in flight
	// logging are the invocations whose stderr the pump may still be
	// reading, oldest first: each stays until the pump reads the sync
	// marker written after it ended.
	logging []*call
	// trailerPids are the children whose trailer was read before their
	// exit was reported: their exits belong to invocations already over.
	trailerPids map[int]bool
	syncs       map[uint64]*syncWait // sync lines waited for and not yet read back
	syncSeq     uint64
	closed      bool // no more prepare goroutines

	slots     chan *slot     // the next request's files; capacity 1
	waiting   *prepWork      // a prepare that waits for the next child: see deferPrepare
	prepWG    sync.WaitGroup // prepare goroutines
	closeOnce sync.Once
}

// child is one pre-forked child of the warm shell.
type child struct {
	pid  int
	done chan struct{} // closed when the warm shell reported its exit
}

// call is one invocation.
type call struct {
	seq    uint64
	id     string // the invocation ID its stderr is filed under
	stderr tail   // bounded tail of its stderr

	// done is closed (under instance.mu) when the result is known: at the
	// trailer, or at the exit of the child that took the request when it
	// wrote none (exit, set -e, a signal).
	done    chan struct{}
	rc      int
	trailer bool   // the result came from the trailer
	pid     int    // the child that wrote its trailer; 0 if none was read
	endSync uint64 // the sync marker written after it ended; 0 before
	wake    func() // interrupts Invoke's read of stdout
}

// finishLocked records c's exit status once; instance.mu is held.
func (c *call) finishLocked(rc int, trailer bool) {
	select {
	case <-c.done:
	default:
		c.rc, c.trailer = rc, trailer
		close(c.done)
	}
}

// start starts the warm shell, its status reader and stderr pump, and the
// goroutine that notices its death.
func start(a *Adapter, spec runtime.FunctionSpec, path, fn, nonce string) (in *instance, err error) {
	// The user's (spec.User): the child makes the outputs file in it.
	scratch := filepath.Join(spec.ScratchDir, "bash-"+nonce)
	if err := spec.User.Mkdir(scratch); err != nil {
		return nil, err
	}
	dirfd, err := syscall.Open(scratch, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		_ = os.RemoveAll(scratch)
		return nil, err
	}
	var files []*os.File // closed on failure
	defer func() {
		if err != nil {
			closeAll(files...)
			_ = syscall.Close(dirfd)
			_ = os.RemoveAll(scratch)
		}
	}()
	var pipes [6]*os.File // status r/w, control r/w, stderr r/w
	for i := 0; i < len(pipes); i += 2 {
		if pipes[i], pipes[i+1], err = os.Pipe(); err != nil {
			return nil, err
		}
		files = append(files, pipes[i], pipes[i+1])
	}
	statusR, statusW, ctlR, ctlW, stderrR, stderrW := pipes[0], pipes[1], pipes[2], pipes[3], pipes[4], pipes[5]

	// Not arguments, which every user can read: see bootstrap.sh.
	cmd := exec.Command(a.bash, "--noprofile", "--norc", "-c", bootstrap, "stoke-bash")
	cmd.Dir = spec.WorkingDir
	// Never nil, which would mean the server's own environment.
	cmd.Env = append(slices.Clip(spec.Env), "__stoke_file="+path, "__stoke_fn="+fn, "__stoke_dir="+scratch,
		"__stoke_nonce="+nonce, "STOKE_RUN_UID="+spec.RunUID)
	// Stdin stays nil: /dev/null. Stdout of the warm shell is what the
	// file prints while it is sourced: a log, not an output.
	cmd.Stdout, cmd.Stderr = stderrW, stderrW
	cmd.ExtraFiles = []*os.File{statusW, ctlR} // fds 3 and 4
	p, err := proc.Start(cmd, proc.AsUser(spec.User.Credential()))
	if err != nil {
		return nil, err
	}
	_ = ctlR.Close() // the warm shell holds its own copy
	dead, cancelDead := context.WithCancel(context.Background())
	in = &instance{
		log: spec.Logger, out: spec.Output, grace: a.grace, proc: p,
		marker:      []byte("\x1e" + nonce + " "),
		ctl:         ctlW,
		status:      statusR,
		stderr:      stderrR,
		statusW:     statusW,
		stderrW:     stderrW,
		scratch:     scratch,
		dirfd:       dirfd,
		user:        spec.User,
		statusDone:  make(chan struct{}),
		pumpDone:    make(chan struct{}),
		dead:        dead,
		deadDone:    make(chan struct{}),
		initDone:    make(chan struct{}),
		trailerPids: map[int]bool{},
		syncs:       map[uint64]*syncWait{},
		slots:       make(chan *slot, 1),
	}
	go in.readStatus()
	go in.pumpStderr()
	go func() {
		defer close(in.deadDone)
		<-p.Done()
		cancelDead()
	}()
	in.prepare(1, nil, nil)
	return in, nil
}

func closeAll(fs ...*os.File) {
	for _, f := range fs {
		_ = f.Close()
	}
}

// Done implements runtime.Instance: the warm shell has exited.
func (in *instance) Done() <-chan struct{} { return in.proc.Done() }

// Close implements runtime.Instance.
func (in *instance) Close() error {
	in.closeOnce.Do(func() {
		in.mu.Lock()
		in.closed = true
		in.mu.Unlock()
		in.proc.Kill(0)
		in.killChild()
		// A child forked but not yet announced (or announced after the
		// kill) reads end-of-file on the control pipe and exits.
		_ = in.ctl.Close()
		_ = in.statusW.Close()
		_ = in.stderrW.Close()
		// Both readers end at end-of-file; a process that left its process
		// group may hold a pipe open, so after the grace period they are
		// cut off.
		t := time.NewTimer(in.grace)
		defer t.Stop()
		expired := false
		await := func(done <-chan struct{}, f *os.File) {
			if !expired {
				select {
				case <-done:
					return
				case <-t.C:
					expired = true
				}
			}
			in.log.Warn("bash runtime: a pipe is still open after the runtime was killed", "pipe", f.Name())
			_ = f.Close()
			<-done
		}
		await(in.statusDone, in.status)
		// The status pipe is drained: cur is now the last child there was.
		in.killChild()
		await(in.pumpDone, in.stderr)
		closeAll(in.status, in.stderr)
		<-in.deadDone
		in.prepWG.Wait()
		select {
		case s := <-in.slots:
			s.close()
		default:
		}
		in.mu.Lock()
		if w := in.waiting; w != nil && w.prev != nil {
			w.prev.close()
		}
		in.waiting = nil
		in.mu.Unlock()
		_ = syscall.Close(in.dirfd)
		if err := os.RemoveAll(in.scratch); err != nil {
			in.log.Warn("bash runtime: removing scratch directory", "error", err)
		}
	})
	return nil
}

func (in *instance) killChild() {
	in.mu.Lock()
	c := in.cur
	in.mu.Unlock()
	if c != nil {
		proc.KillGroup(c.pid, 0, nil)
	}
}
