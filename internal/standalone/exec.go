package standalone

import (
	"stoke.dev/stoke/internal/exec"
	"stoke.dev/stoke/internal/gateway"
)

// ExecRoute finds the exec hop of the pod a running task or a Ready
// function is assigned to, from the informer's memory, for the gateway's
// exec endpoint.
func (s *Standalone) ExecRoute(namespace, name string) (exec.Executor, string, error) {
	run, err := s.routedRun(namespace, name)
	if err != nil {
		return nil, "", err
	}
	if err := gateway.Execable(run); err != nil {
		return nil, "", err
	}
	pd := s.daemon(run.Status.AssignedPodUID)
	if pd == nil {
		return nil, "", gateway.PodGone(run)
	}
	return pd.d.Exec(), string(run.UID), nil
}
