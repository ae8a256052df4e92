package pool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	executorv1 "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/cgroup"
	"stoke.dev/stoke/internal/loglines"
	"stoke.dev/stoke/internal/podsource"
	"stoke.dev/stoke/internal/proc"
	"stoke.dev/stoke/internal/shm"
)

// healthService is the service a pod's health check asks about.
var healthService = executorv1.Runtime_ServiceDesc.ServiceName

// pumpGrace is how long the log pump may keep reading after the pod's
// processes were killed: a process that escaped the kill must not hold the
// pod's goroutine through the write end of its pipe.
const pumpGrace = time.Second

// sidFile, in a pod's directory, records the session its Runtime Server
// leads (proc.Session's text), so that a supervisor started after this
// one died can kill what is left of it.
const sidFile = "sid"

// ipcFile, in a pod's directory, records the pod's IPC directory when it
// lies outside the pod's directory (on /dev/shm), so that a supervisor
// started after this one died can remove it.
const ipcFile = "ipc"

// cgroupFile, in a pod's directory, records the pod's cgroup (written
// before the group is created), so that a supervisor started after this
// one died can kill everything in it, even what left the pod's session.
const cgroupFile = "cgroup"

// ipcPrefix starts the name of every pod's IPC directory on /dev/shm.
const ipcPrefix = "stoke-pod-"

// runPod runs one pod from start to death: it starts the Runtime Server,
// calls ready once it answers its health check, checks it every
// HealthInterval, and returns why the pod ended, only after its processes
// are dead. pr.stop asks it to stop the pod; pod is its own copy of the
// pod's description and dir the pod's directory, removed at the end.
//
// The Runtime Server leads a session of its own, which fence kills when
// the pod ends, and gets SIGTERM if the supervisor's process dies, so that
// it drains and kills its process groups. The kernel sends that signal
// when the thread that started the server ends, so runPod keeps its
// goroutine, and with it nothing else, on that thread until the pod is
// gone (see proc.Start).
func (s *Supervisor) runPod(pr *podRun, pod podsource.Pod, dir string, ready func()) string {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	log := s.log.With("runtime", pod.Namespace+"/"+pod.Runtime, "pod", pod.Name, "pod_uid", pod.UID)
	defer func() {
		if err := os.RemoveAll(dir); err != nil {
			log.Warn("cannot remove pod directory", "dir", dir, "err", err)
		}
	}()
	sock := filepath.Join(dir, socketName)
	// Not in dir: with a RunAs user the Runs reach their scratch
	// directories through it, and dir holds the pod's sockets.
	stateDir := filepath.Join(s.scratchDir, pod.Name)
	if err := s.cfg.RunAs.Passage(stateDir); err != nil {
		log.Error("cannot create pod state directory", "err", err)
		return reasonStartFailed
	}
	defer func() {
		if err := os.RemoveAll(stateDir); err != nil {
			log.Warn("cannot remove pod state directory", "dir", stateDir, "err", err)
		}
	}()
	ipcDir, err := makeIPCDir(dir, stateDir)
	if err != nil {
		log.Error("cannot create pod IPC directory", "err", err)
		return reasonStartFailed
	}
	defer func() {
		if err := os.RemoveAll(ipcDir); err != nil {
			log.Warn("cannot remove pod IPC directory", "dir", ipcDir, "err", err)
		}
	}()
	mode := cgroup.Subreaper
	var opts []proc.Option
	if s.cfg.Cgroup != nil {
		cg, fd, err := s.makePodCgroup(dir, pod)
		if err != nil {
			log.Error("cannot create the pod's cgroup", "err", err)
			return reasonStartFailed
		}
		defer func() {
			if err := cg.Remove(); err != nil {
				log.Warn("cannot remove the pod's cgroup", "err", err)
			}
		}()
		defer fd.Close()
		opts = append(opts, proc.InCgroup(int(fd.Fd())))
		mode = cgroup.Auto
	}
	args := []string{
		"runtime-server",
		"--runtime", pod.Server,
		"--listen", "unix:" + sock,
		"--workspace-root", s.runsDir,
		"--state-dir", stateDir,
		"--ipc-dir", ipcDir,
		"--shutdown-grace", s.cfg.ShutdownGrace.String(),
		"--containment", string(mode),
	}
	if s.cfg.RunLogDir != "" {
		args = append(args, "--run-log-dir", s.cfg.RunLogDir)
	}
	if s.cfg.DebugSockets {
		args = append(args, "--debug-socket", filepath.Join(dir, DebugSocketName))
	}
	// A lambda pod starts no user code here: its Runs run on AWS Lambda,
	// and what it starts locally (the task relay) is Stoke's own and
	// talks to it over its private socket.
	if s.cfg.RunAs != nil && pod.Server != "lambda" {
		args = append(args, "--run-as-user", s.cfg.RunAs.String())
	}
	if pod.Server == "python" || pod.Server == "lambda" {
		// One requirements cache for every python pod (internal/pydeps),
		// and for the packages of python functions on Lambda; pip's index
		// settings come from stoke up's environment (PIP_*).
		args = append(args, "--python-deps", filepath.Join(s.cfg.DataDir, "pydeps"))
	}
	args = append(args, podsource.HandlerEnvArgs(pod.Template)...)
	args = append(args, podsource.LambdaArgs(pod.Lambda)...)
	cmd := s.cfg.Command(pod, args)
	setRuntimeEnv(cmd, pod.Template)
	// Our own pipe rather than exec's copying goroutine, so that the exit
	// is seen at once even if something still holds the write end.
	r, w, err := os.Pipe()
	if err != nil {
		log.Error("cannot create pod log pipe", "err", err)
		return reasonStartFailed
	}
	if cmd.Stdout == nil {
		cmd.Stdout = w
	}
	if cmd.Stderr == nil {
		cmd.Stderr = w
	}
	p, err := proc.Start(cmd, append(opts, proc.NewSession(), proc.ParentDeathSignal(syscall.SIGTERM))...)
	_ = w.Close() // the child has its copy; EOF needs ours closed
	if err != nil {
		_ = r.Close()
		log.Error("cannot start runtime server", "err", err)
		return reasonStartFailed
	}
	log = log.With("pid", p.Pid())
	log.Info("pod starting", "server", pod.Server)
	recordSession(p, dir, log)
	pumped := make(chan struct{})
	go func() {
		defer close(pumped)
		forwardLogs(r, log)
	}()
	defer func() {
		t := s.clk.NewTimer(pumpGrace)
		defer t.Stop()
		select {
		case <-pumped:
		case <-t.C():
			log.Warn("pod output still open after its processes were killed; closing it")
		}
		_ = r.Close()
		<-pumped
	}()
	return s.supervise(pr, p, sock, log, ready)
}

// recordSession writes the session of the pod's Runtime Server p to the
// pod's sidFile. Without it a pod still runs, but what it leaves when the
// supervisor is killed is only reached by its own drain.
func recordSession(p *proc.Process, dir string, log *slog.Logger) {
	sess, err := proc.SessionOf(p.Pid())
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, sidFile), []byte(sess.String()+"\n"), 0o600)
	}
	if err != nil {
		log.Warn("cannot record the pod's session", "err", err)
	}
}

// supervise waits for the started Runtime Server p to become ready, then
// health-checks it until it exits, turns unhealthy or is asked to stop.
func (s *Supervisor) supervise(pr *podRun, p *proc.Process, sock string, log *slog.Logger, ready func()) string {
	// life ends when the process exits or a stop is asked for, so that no
	// health check outlives its reason.
	life, endLife := context.WithCancel(context.Background())
	lifeDone := make(chan struct{})
	go func() {
		defer close(lifeDone)
		select {
		case <-p.Done():
		case <-pr.stop:
		case <-life.Done():
		}
		endLife()
	}()
	defer func() {
		endLife()
		<-lifeDone
	}()

	conn, err := grpc.NewClient("unix://"+sock,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// Reconnect quickly: the socket appears moments after the start.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
			BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second,
		}}),
	)
	if err != nil {
		log.Error("cannot create health client", "err", err)
		fence(p, log)
		return reasonStartFailed
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	req := &healthpb.HealthCheckRequest{Service: healthService}

	// Start-up: wait (bounded) until the server answers SERVING.
	start, cancelStart := context.WithTimeout(life, s.cfg.StartTimeout)
	for {
		resp, err := health.Check(start, req, grpc.WaitForReady(true))
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
		t := s.clk.NewTimer(s.cfg.HealthInterval)
		select {
		case <-t.C():
		case <-start.Done():
		}
		t.Stop()
		if start.Err() != nil {
			cancelStart()
			select {
			case <-pr.stop:
				return s.terminate(pr, p, log)
			case <-p.Done():
				return exited(p, log)
			default:
			}
			log.Error("runtime server did not become ready; killing it", "timeout", s.cfg.StartTimeout, "err", err)
			fence(p, log)
			return reasonStartFailed
		}
	}
	cancelStart()
	pr.heartbeat.Store(s.clk.Now().UnixNano())
	ready()

	tick := s.clk.NewTicker(s.cfg.HealthInterval)
	defer tick.Stop()
	failures := 0
	for {
		select {
		case <-p.Done():
			return exited(p, log)
		case <-pr.stop:
			return s.terminate(pr, p, log)
		case <-tick.C():
		}
		ctx, cancel := context.WithTimeout(life, s.cfg.CheckTimeout)
		resp, err := health.Check(ctx, req)
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			failures = 0
			pr.heartbeat.Store(s.clk.Now().UnixNano())
			continue
		}
		if life.Err() != nil {
			continue // exited or stopping: the select above says which
		}
		failures++
		if err == nil {
			log.Warn("health check failed", "status", resp.GetStatus().String(), "failures", failures)
		} else {
			log.Warn("health check failed", "err", err, "failures", failures)
		}
		if failures >= s.cfg.UnhealthyAfter {
			log.Error("pod unhealthy; fencing it", "failures", failures)
			fence(p, log)
			return podsource.ReasonUnhealthy
		}
	}
}

// exited handles a Runtime Server that exited by itself: what is left of
// its session is killed.
func exited(p *proc.Process, log *slog.Logger) string {
	log.Warn("runtime server exited", "exit_code", p.ExitCode())
	fence(p, log)
	return podsource.ReasonExited
}

// terminate stops the pod for pr.stopReason: SIGTERM to its group, so the
// Runtime Server drains for its --shutdown-grace and kills the process
// groups it started, then the fence (for whatever is left of the session)
// once it has exited or after a bound.
func (s *Supervisor) terminate(pr *podRun, p *proc.Process, log *slog.Logger) string {
	select {
	case <-p.Done():
	default:
		log.Info("stopping pod", "reason", pr.stopReason)
		_ = syscall.Kill(-p.Pid(), syscall.SIGTERM)
		t := s.clk.NewTimer(s.cfg.ShutdownGrace + killSlack)
		select {
		case <-p.Done():
		case <-t.C():
			log.Warn("runtime server did not stop in time; killing it")
		}
		t.Stop()
	}
	fence(p, log)
	return pr.stopReason
}

// forwardLogs logs each line of a pod's output: the Runtime Server's own
// log, its events (the Runs' output goes to their logs, never here). A
// line that is a JSON log record (the Runtime Server logs with slog's JSON
// handler) is logged at its level and with its message, the record itself
// as attribute "child".
func forwardLogs(r io.Reader, log *slog.Logger) {
	ctx := context.Background()
	loglines.Pump(r, func(line []byte) {
		var rec struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
		}
		if bytes.HasPrefix(line, []byte("{")) && json.Unmarshal(line, &rec) == nil {
			var level slog.Level
			if level.UnmarshalText([]byte(rec.Level)) != nil {
				level = slog.LevelInfo
			}
			if log.Enabled(ctx, level) {
				log.Log(ctx, level, rec.Msg, "child", json.RawMessage(bytes.Clone(line)))
			}
			return
		}
		log.Info("runtime server output", "line", string(line))
	})
}

// makeIPCDir makes the directory in which a pod's warm Bash functions
// exchange request files and FIFOs: on /dev/shm when that is a writable
// tmpfs, recorded in the pod's directory dir first, otherwise in stateDir.
func makeIPCDir(dir, stateDir string) (string, error) {
	return shm.MkdirRecorded(stateDir, ipcPrefix, func(ipcDir string) error {
		return os.WriteFile(filepath.Join(dir, ipcFile), []byte(ipcDir+"\n"), 0o600)
	})
}

// makePodCgroup records the pod's cgroup in its directory dir, then
// creates it (a leftover of the same name is killed and removed first) and
// opens it for proc.InCgroup.
func (s *Supervisor) makePodCgroup(dir string, pod podsource.Pod) (*cgroup.Group, *os.File, error) {
	name := "pod-" + pod.UID
	path := filepath.Join(s.cfg.Cgroup.Path(), name)
	if err := os.WriteFile(filepath.Join(dir, cgroupFile), []byte(path+"\n"), 0o600); err != nil {
		return nil, nil, err
	}
	if old, err := s.cfg.Cgroup.Within(path); err == nil {
		if err := old.Remove(); err != nil {
			return nil, nil, err
		}
	}
	cg, err := s.cfg.Cgroup.Child(name)
	if err != nil {
		return nil, nil, err
	}
	fd, err := cg.Open()
	if err != nil {
		_ = cg.Remove()
		return nil, nil, err
	}
	return cg, fd, nil
}

// removeRecordedCgroup kills and removes the cgroup that the pod whose
// directory is podDir recorded, if it recorded one inside this
// supervisor's own group; a record outside it is refused.
func (s *Supervisor) removeRecordedCgroup(podDir string, log *slog.Logger) {
	b, err := os.ReadFile(filepath.Join(podDir, cgroupFile))
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		log.Warn("cannot read the cgroup of an earlier pod", "err", err)
		return
	}
	if s.cfg.Cgroup == nil {
		log.Warn("an earlier pod ran in a cgroup, but this supervisor uses none; leaving it", "cgroup", strings.TrimSpace(string(b)))
		return
	}
	cg, err := s.cfg.Cgroup.Within(strings.TrimSpace(string(b)))
	if err != nil {
		log.Error("refusing the recorded cgroup of an earlier pod", "err", err)
		return
	}
	if err := cg.Remove(); err != nil {
		log.Error("cannot kill the cgroup of an earlier pod", "err", err)
		return
	}
	log.Info("killed and removed the cgroup of an earlier pod", "cgroup", cg.Path())
}

// removeRecordedIPC removes the IPC directory on /dev/shm that the pod
// whose directory is podDir recorded, if it recorded one.
func removeRecordedIPC(podDir string) error {
	b, err := os.ReadFile(filepath.Join(podDir, ipcFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return shm.RemoveRecorded(strings.TrimSpace(string(b)), ipcPrefix)
}

// RemoveIPCDirs removes the IPC directories on /dev/shm that the pods of a
// supervisor on dataDir recorded. A supervisor started on dataDir does
// this itself; RemoveIPCDirs is for one that died and will not be
// restarted, such as a test's.
func RemoveIPCDirs(dataDir string) error {
	dirs, err := filepath.Glob(filepath.Join(dataDir, "pods", "*"))
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range dirs {
		errs = append(errs, removeRecordedIPC(d))
	}
	return errors.Join(errs...)
}

// setRuntimeEnv puts the Runtime's env in its pod's environment, where
// --handler-env names it, so that the values, which may be secrets, are
// never in the pod's arguments.
func setRuntimeEnv(cmd *exec.Cmd, tpl *v1alpha1.RuntimeTemplate) {
	if tpl == nil || len(tpl.Env) == 0 {
		return
	}
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	for _, e := range tpl.Env {
		cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
	}
}
