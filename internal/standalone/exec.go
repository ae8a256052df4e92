package standalone

import (
	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/exec"
)

// ExecRoute finds the exec hop of the pod a running task or a Ready
// function is assigned to, from the informer's memory, for the gateway's
// exec endpoint.
func (s *Standalone) ExecRoute(namespace, name string) (exec.Executor, string, error) {
	run, ok := s.runInf.Get(namespace, name)
	if !ok {
		return nil, "", errdefs.Errorf(errdefs.ErrNotFound, "run %s/%s not found", namespace, name)
	}
	if p := run.Status.Phase; p != v1alpha1.PhaseRunning && p != v1alpha1.PhaseReady {
		return nil, "", errdefs.Errorf(errdefs.ErrNotRunning, "run %s/%s is %s: exec needs a running task or a Ready function", namespace, name, p)
	}
	pd := s.daemon(run.Status.AssignedPodUID)
	if pd == nil {
		return nil, "", errdefs.Errorf(errdefs.ErrUnavailable, "run %s/%s: its pod %s is gone", namespace, name, run.Status.AssignedPod)
	}
	return pd.d.Exec(), string(run.UID), nil
}
