package docker

import (
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
)

// RuntimeReader is implemented by a Backend that holds the Runtimes in
// memory: the Docker API then refuses, on a container whose Runtime is on
// AWS Lambda, what Lambda cannot do, and selects a Runtime by the image
// it names (resolve).
type RuntimeReader interface {
	CachedRuntime(namespace, name string) (*v1alpha1.Runtime, bool)
	CachedRuntimes(namespace string) []*v1alpha1.Runtime
}

// onLambda reports whether the container's Run runs in a Lambda sandbox.
func (s *Server) onLambda(c *ctr) bool {
	rr, ok := s.cfg.Backend.(RuntimeReader)
	if !ok {
		return false
	}
	rt, ok := rr.CachedRuntime(s.cfg.Namespace, c.runtime)
	return ok && rt.Spec.Lambda != nil
}

// notOnLambda refuses what a Lambda sandbox cannot do (501), saying so.
func notOnLambda(c *ctr, what string) error {
	return errdefs.Errorf(errdefs.ErrUnimplemented, "container %s runs on AWS Lambda (Runtime %s), which cannot %s; docs/docker.md, \"On Lambda\"", c.name, c.runtime, what)
}

// lambdaSignal refuses a signal Lambda cannot deliver: the sandbox's task
// takes no signal but its end (SIGKILL, which cancels the Run).
func lambdaSignal(c *ctr, sig syscall.Signal) error {
	return notOnLambda(c, "deliver "+strings.TrimPrefix(unix.SignalName(sig), "SIG")+" to its task: only SIGKILL (docker kill, docker stop), which ends the task")
}
