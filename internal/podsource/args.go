package podsource

import (
	"regexp"
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
	for _, f := range []struct{ flag, v string }{
		{"--lambda-agent-listen", l.AgentListen}, {"--lambda-agent-url", l.AgentURL},
		{"--lambda-agent-cert", l.AgentCert}, {"--lambda-agent-key", l.AgentKey},
	} {
		if f.v != "" {
			args = append(args, f.flag, f.v)
		}
	}
	if l.Image != "" {
		args = append(args, "--lambda-image", l.Image)
	}
	return args
}

// envName is what a handler's env name may be: internal/validation's
// rule, and the Runtime Server's.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// HandlerEnvArgs are the `stoke runtime-server` flags that give every
// handler a Runtime's env: the names of spec.template.env, whose values
// the server has in its own environment (a Kubernetes container's env,
// Secrets and the downward API resolved by the kubelet; a standalone
// pod's environment, set by internal/pool), never in its arguments. With
// a user's image the handlers get the container's whole environment
// ("*"), the image's ENV included: how a user's image finds its packages.
func HandlerEnvArgs(tpl *v1alpha1.RuntimeTemplate) []string {
	if tpl == nil {
		return nil
	}
	if tpl.Image != "" {
		return []string{"--handler-env", "*"}
	}
	args := make([]string, 0, 2*len(tpl.Env))
	for _, e := range tpl.Env {
		// A name no handler env can carry (one the CRD could not refuse)
		// stays the container's alone.
		if envName.MatchString(e.Name) {
			args = append(args, "--handler-env", e.Name)
		}
	}
	return args
}
