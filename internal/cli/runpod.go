package cli

import (
	"context"
	"fmt"

	"stoke.dev/stoke/internal/client"
)

// RunPod is the pod the Run name in ns is on (its status.assignedPod),
// for `stoke debug pprof --process RUN`. A Run on no pod (not yet
// assigned, or ended) is an error saying its phase.
func RunPod(ctx context.Context, c client.API, ns, name string) (string, error) {
	run, err := c.GetRun(ctx, ns, name)
	if err != nil {
		return "", err
	}
	if run.Status.AssignedPod == "" || run.Status.Phase.Terminal() {
		phase := string(run.Status.Phase)
		if phase == "" {
			phase = "new"
		}
		return "", fmt.Errorf("run %s/%s (uid %s) is %s and on no pod: there is no process of it to profile", ns, name, run.UID, phase)
	}
	return run.Status.AssignedPod, nil
}
