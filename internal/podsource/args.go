package podsource

import (
	"strconv"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

// LambdaArgs are the `stoke runtime-server` flags of a Runtime's
// spec.lambda, for both kinds of pod: standalone's local processes and
// Kubernetes' runtime Pods.
func LambdaArgs(l *v1alpha1.LambdaSpec) []string {
	if l == nil {
		return nil
	}
	args := []string{"--lambda-runtime", l.Runtime, "--lambda-role", l.Role}
	if l.Architecture != "" {
		args = append(args, "--lambda-architecture", l.Architecture)
	}
	if l.MemoryMB != 0 {
		args = append(args, "--lambda-memory", strconv.Itoa(int(l.MemoryMB)))
	}
	if l.NamePrefix != "" {
		args = append(args, "--lambda-name-prefix", l.NamePrefix)
	}
	if l.Bootstrap != "" {
		args = append(args, "--lambda-bootstrap", l.Bootstrap)
	}
	return args
}
