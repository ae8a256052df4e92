package lambdasim

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/proc"
)

// rieStartTimeout bounds how long an RIE may take to listen.
const rieStartTimeout = 10 * time.Second

// logKeep is how much of a sandbox's output the simulator remembers.
const logKeep = 64 << 10

// sandbox is one execution environment: an unpacked package served by an
// RIE process, whose session holds the bootstrap and everything it starts.
type sandbox struct {
	function  string
	started   time.Time
	dir       string
	p         *proc.Process
	invokeURL string
	hc        *http.Client
	logs      *ring
	pumped    chan struct{}
	killOnce  sync.Once
}

// startSandbox unpacks the package and starts an RIE for it.
func (s *Simulator) startSandbox(ctx context.Context, fn *function, conf configuration, zipFile []byte) (*sandbox, error) {
	var code string // LAMBDA_TASK_ROOT
	var argv []string
	if fn.imageURI != "" {
		img := s.cfg.Images[fn.imageURI]
		code = filepath.Join(img.Root, TaskRoot)
		argv = img.Entrypoint
		if c := conf.ImageConfig; c != nil && len(c.ImageConfig.EntryPoint) > 0 {
			argv = c.ImageConfig.EntryPoint
		}
		if c := conf.ImageConfig; c != nil {
			argv = append(slices.Clone(argv), c.ImageConfig.Command...)
		}
		if len(argv) == 0 {
			return nil, fmt.Errorf("image %s has no entrypoint", fn.imageURI)
		}
		argv = append([]string{filepath.Join(img.Root, argv[0])}, argv[1:]...)
	} else {
		// The package is unpacked once per function and shared, read-only
		// in spirit, by its sandboxes, as Lambda's /var/task is.
		fn.unpackOnce.Do(func() {
			fn.code, fn.unpackErr = os.MkdirTemp(s.cfg.Dir, conf.FunctionName+"-code-")
			if fn.unpackErr == nil {
				fn.unpackErr = unzip(zipFile, fn.code)
			}
		})
		if fn.unpackErr != nil {
			return nil, fmt.Errorf("unpacking the package: %w", fn.unpackErr)
		}
		code = fn.code
		var err error
		if argv, err = runtimeCommand(conf, code); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp(s.cfg.Dir, conf.FunctionName+"-")
	if err != nil {
		return nil, err
	}
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	sb, err := startRIE(ctx, s.cfg.RIE, dir, code, argv, sandboxEnv(conf, code, tmp))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	sb.function = conf.FunctionName
	s.remember(sb)
	return sb, nil
}

// runtimeCommand is how a Zip function's runtime starts in code, its
// unpacked package: an OS-only runtime runs the package's bootstrap; a
// managed Python runtime runs its own start-up command (this machine's
// python3 with Lambda's runtime client, which the simulator does not have)
// or, with AWS_LAMBDA_EXEC_WRAPPER, the wrapper with that command as its
// arguments, the wrapper's /var/task taken in the package.
func runtimeCommand(conf configuration, code string) ([]string, error) {
	if !managedPython(conf.Runtime) {
		return []string{filepath.Join(code, "bootstrap")}, nil
	}
	python, err := exec.LookPath("python3")
	if err != nil {
		return nil, fmt.Errorf("the managed runtime %s: %w", conf.Runtime, err)
	}
	argv := []string{python, managedRuntimeScript}
	var wrapper string
	if conf.Environment != nil {
		wrapper = conf.Environment.Variables["AWS_LAMBDA_EXEC_WRAPPER"]
	}
	if wrapper == "" {
		return argv, nil
	}
	if rel, ok := strings.CutPrefix(wrapper, TaskRoot+"/"); ok {
		wrapper = filepath.Join(code, rel)
	}
	return append([]string{wrapper}, argv...), nil
}

// startRIE starts an RIE serving argv (the runtime's command) in task with
// env; dir is the sandbox's directory, removed by kill.
func startRIE(ctx context.Context, rie, dir, task string, argv []string, env []string) (*sandbox, error) {
	var err error
	for range 3 { // a free port found may be taken before the RIE binds it
		var sb *sandbox
		if sb, err = startRIEOnce(ctx, rie, dir, task, argv, env); err == nil || ctx.Err() != nil {
			return sb, err
		}
	}
	return nil, err
}

func startRIEOnce(ctx context.Context, rie, dir, task string, argv []string, env []string) (*sandbox, error) {
	addrs, err := freeAddrs(2)
	if err != nil {
		return nil, err
	}
	invokeAddr, apiAddr := addrs[0], addrs[1]
	cmd := exec.Command(rie,
		"--runtime-interface-emulator-address", invokeAddr,
		"--runtime-api-address", apiAddr,
		"--log-level", "warn")
	cmd.Args = append(cmd.Args, argv...)
	cmd.Dir = task
	cmd.Env = env
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = w, w
	p, err := proc.Start(cmd, proc.NewSession())
	_ = w.Close()
	if err != nil {
		_ = r.Close()
		return nil, fmt.Errorf("starting the RIE: %w", err)
	}
	sb := &sandbox{
		started: time.Now(), dir: dir, p: p, invokeURL: "http://" + invokeAddr + "/2015-03-31/functions/function/invocations",
		hc:     &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}},
		logs:   &ring{max: logKeep},
		pumped: make(chan struct{}),
	}
	go func() {
		defer close(sb.pumped)
		defer r.Close()
		_, _ = io.Copy(sb.logs, r)
	}()
	// The RIE says nothing when it listens: dial until it answers. Both
	// addresses: it starts its Runtime API's listener on a goroutine of
	// its own, racing the first invocation, which starts the runtime;
	// under load the runtime's first call for an event was refused now and
	// then, and it exited (Runtime.ExitError). On Lambda the Runtime API
	// listens before the runtime starts, so no invocation goes to the
	// sandbox before it does.
	deadline := time.Now().Add(rieStartTimeout)
	for _, addr := range []string{invokeAddr, apiAddr} {
		if err := awaitListening(ctx, p, addr, deadline); err != nil {
			sb.kill()
			if errors.Is(err, errExited) {
				return nil, fmt.Errorf("the RIE exited at start: %s", bytes.TrimSpace(sb.logs.since(0, 2048)))
			}
			return nil, err
		}
	}
	return sb, nil
}

// errExited: the RIE exited before it listened.
var errExited = errors.New("the RIE exited")

// awaitListening dials addr until it accepts, p exits, ctx ends or the
// deadline passes.
func awaitListening(ctx context.Context, p *proc.Process, addr string, deadline time.Time) error {
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-p.Done():
			return errExited
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the RIE did not listen on %s within %s", addr, rieStartTimeout)
		}
	}
}

// Sandbox is one RIE serving a bootstrap, without the control plane: for
// benchmarks that compare bootstraps under the RIE alone.
type Sandbox struct{ sb *sandbox }

// StartSandbox starts the RIE at rie serving taskDir/bootstrap with the
// function's environment env ("K=V"; the RIE passes it on). Close kills it
// and removes dir, which holds taskDir.
func StartSandbox(ctx context.Context, rie, dir, taskDir string, env []string) (*Sandbox, error) {
	env = append([]string{"PATH=" + os.Getenv("PATH"), "LAMBDA_TASK_ROOT=" + taskDir, "AWS_LAMBDA_FUNCTION_TIMEOUT=600",
		"AWS_ACCESS_KEY_ID=SIMULATED", "AWS_SECRET_ACCESS_KEY=SIMULATED", "AWS_SESSION_TOKEN=SIMULATED"}, env...)
	sb, err := startRIE(ctx, rie, dir, taskDir, []string{filepath.Join(taskDir, "bootstrap")}, env)
	if err != nil {
		return nil, err
	}
	return &Sandbox{sb: sb}, nil
}

// Invoke sends one event and returns the answer's body.
func (s *Sandbox) Invoke(ctx context.Context, event []byte) ([]byte, error) {
	res := s.sb.invoke(ctx, newRequestID(), event, 10*time.Minute)
	if res.functionError {
		return res.body, fmt.Errorf("function error: %s", res.body)
	}
	return res.body, nil
}

// Close kills the sandbox.
func (s *Sandbox) Close() { s.sb.kill() }

// Logs is what the sandbox wrote (its last 64 KiB): the RIE's lines and
// the runtime's stdout and stderr, all of it once Close has returned.
func (s *Sandbox) Logs() string { return string(s.sb.logs.since(0, logKeep)) }

// sandboxEnv is the environment Lambda gives a function (a managed
// runtime's adds AWS_EXECUTION_ENV). The RIE hands its own environment to
// the runtime.
func sandboxEnv(conf configuration, task, tmp string) []string {
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"LANG=C.UTF-8",
		"TMPDIR=" + tmp, // each sandbox has its own /tmp
		"LAMBDA_TASK_ROOT=" + task,
		"LAMBDA_RUNTIME_DIR=/var/runtime",
		"_HANDLER=" + conf.Handler,
		"AWS_LAMBDA_FUNCTION_NAME=" + conf.FunctionName,
		"AWS_LAMBDA_FUNCTION_VERSION=$LATEST",
		"AWS_LAMBDA_FUNCTION_MEMORY_SIZE=" + strconv.Itoa(int(conf.MemorySize)),
		// The function's own: the RIE gives each invocation its deadline
		// (Lambda-Runtime-Deadline-Ms) from it, counted after init as on
		// Lambda, which the bootstrap's deadline notice reads. The
		// simulator enforces the timeout too, killing the sandbox.
		"AWS_LAMBDA_FUNCTION_TIMEOUT=" + strconv.Itoa(int(conf.Timeout)),
		"AWS_REGION=" + Region,
		"AWS_DEFAULT_REGION=" + Region,
		"AWS_ACCESS_KEY_ID=SIMULATED",
		"AWS_SECRET_ACCESS_KEY=SIMULATED",
		"AWS_SESSION_TOKEN=SIMULATED",
	}
	if managedPython(conf.Runtime) {
		env = append(env, "AWS_EXECUTION_ENV=AWS_Lambda_"+conf.Runtime)
	}
	if conf.Environment != nil {
		for k, v := range conf.Environment.Variables {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// kill ends the sandbox's whole session and removes its directory.
func (sb *sandbox) kill() {
	sb.killOnce.Do(func() {
		_, _ = proc.KillSession(sb.p.Pid(), 2*time.Second)
		sb.p.Kill(time.Second)
		<-sb.p.Done()
		sb.hc.CloseIdleConnections()
		select {
		case <-sb.pumped:
		case <-time.After(2 * time.Second):
		}
		_ = os.RemoveAll(sb.dir)
	})
}

// unzip unpacks a package into dir, refusing paths that leave it and
// packages that expand past bounds.LambdaUnzipped. The entries are checked
// here and inflated by python3's zipfile (zlib in C: inflating tens of
// megabytes in Go's own code is slow in a test binary built with -race);
// the modes, which zipfile does not set, are applied after.
func unzip(b []byte, dir string) error {
	zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		return err
	}
	var total int64
	for _, f := range zr.File {
		name := filepath.Clean(f.Name)
		if filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("%s: path leaves the package", f.Name)
		}
		total += int64(f.UncompressedSize64)
		if total > bounds.LambdaUnzipped {
			return fmt.Errorf("unzipped size must be smaller than %d bytes", bounds.LambdaUnzipped)
		}
	}
	zipPath := dir + ".zip"
	if err := os.WriteFile(zipPath, b, 0o600); err != nil {
		return err
	}
	defer os.Remove(zipPath)
	if out, err := exec.Command("python3", "-m", "zipfile", "-e", zipPath, dir).CombinedOutput(); err != nil {
		return fmt.Errorf("python3 -m zipfile: %w: %s", err, out)
	}
	for _, f := range zr.File {
		if f.FileInfo().IsDir() {
			continue
		}
		if err := os.Chmod(filepath.Join(dir, filepath.Clean(f.Name)), f.Mode().Perm()|0o400); err != nil {
			return err
		}
	}
	return nil
}

// freeAddrs finds n free TCP addresses for a sandbox's RIE to listen on,
// on a loopback address of its own (127.0.0.0/8 is all loopback): the
// ports are free when found but not held, and on 127.0.0.1, shared with
// every other listener and outgoing connection of the machine, another
// sandbox starting at the same time took one of them now and then before
// its RIE bound it (bind: address already in use, or worse, a dial that
// reached the other sandbox's RIE).
func freeAddrs(n int) ([]string, error) {
	var b [3]byte
	_, _ = rand.Read(b[:])
	ip := net.IPv4(127, b[0], b[1], 1+b[2]%254).String()
	var addrs []string
	var lis []net.Listener
	defer func() {
		for _, l := range lis {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			return nil, err
		}
		lis = append(lis, l)
		addrs = append(addrs, l.Addr().String())
	}
	return addrs, nil
}

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// ring keeps the last max bytes written to it and counts all of them.
type ring struct {
	mu      sync.Mutex
	max     int
	buf     []byte
	written int64
	changed chan struct{} // closed and replaced by every Write
}

// waitFor waits until the output after mark contains needle, or for at
// most d.
func (r *ring) waitFor(mark int64, needle string, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		r.mu.Lock()
		if r.changed == nil {
			r.changed = make(chan struct{})
		}
		ch := r.changed
		r.mu.Unlock()
		if bytes.Contains(r.since(mark, r.max), []byte(needle)) {
			return
		}
		select {
		case <-ch:
		case <-t.C:
			return
		}
	}
}

func (r *ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buf = append(r.buf, p...)
	if over := len(r.buf) - r.max; over > 0 {
		r.buf = append(r.buf[:0], r.buf[over:]...)
	}
	r.written += int64(len(p))
	if r.changed != nil {
		close(r.changed)
		r.changed = nil
	}
	return len(p), nil
}

// mark is the count of bytes written so far.
func (r *ring) mark() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.written
}

// since returns at most the last n bytes written after mark that are still
// kept.
func (r *ring) since(mark int64, n int) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	avail := int(min(r.written-mark, int64(len(r.buf))))
	avail = min(avail, n)
	return bytes.Clone(r.buf[len(r.buf)-avail:])
}
