package nodeagent

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"stoke.dev/stoke/internal/kubetest/nodeagent/containerinit"
)

type probeKind string

const (
	readiness probeKind = "readiness"
	liveness  probeKind = "liveness"
	startup   probeKind = "startup"
)

func (c *container) probe(k probeKind) *corev1.Probe {
	switch k {
	case readiness:
		return c.spec.ReadinessProbe
	case liveness:
		return c.spec.LivenessProbe
	}
	return c.spec.StartupProbe
}

// startProbes starts one goroutine per probe of c's run gen; ctx ends them.
func (w *podWorker) startProbes(ctx context.Context, c *container, gen int) {
	for _, k := range []probeKind{startup, readiness, liveness} {
		p := c.probe(k)
		if p == nil {
			continue
		}
		go w.prober(ctx, c, gen, k, p)
	}
}

// prober runs probe p every periodSeconds after initialDelaySeconds and
// reports each result; run applies the thresholds.
func (w *podWorker) prober(ctx context.Context, c *container, gen int, k probeKind, p *corev1.Probe) {
	period := time.Duration(p.PeriodSeconds) * time.Second
	if period <= 0 {
		period = 10 * time.Second
	}
	timeout := time.Duration(p.TimeoutSeconds) * time.Second
	if timeout <= 0 {
		timeout = time.Second
	}
	delay := time.Duration(p.InitialDelaySeconds) * time.Second
	sock := ""
	w.smu.Lock()
	sock = w.sockets[c.spec.Name]
	w.smu.Unlock()
	ip := w.ip.String()
	ports := c.spec.Ports
	env := map[string]string{}
	for _, e := range c.spec.Env {
		if e.ValueFrom == nil {
			env[e.Name] = e.Value
		}
	}
	for {
		if delay > 0 {
			select {
			case <-ctx.Done():
				return
			case <-w.a.clock.After(delay):
			}
		}
		delay = period
		ok, msg := runProbe(ctx, p, timeout, sock, ip, ports, env)
		if ctx.Err() != nil {
			return
		}
		select {
		case w.events <- event{c: c, gen: gen, probe: &k, ok: ok, msg: msg}:
		case <-ctx.Done():
			return
		}
	}
}

// runProbe runs one probe: exec in the container through its init,
// httpGet and tcpSocket against the Pod IP (or the probe's host).
func runProbe(ctx context.Context, p *corev1.Probe, timeout time.Duration, sock, ip string, ports []corev1.ContainerPort, env map[string]string) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, timeout+time.Second)
	defer cancel()
	switch {
	case p.Exec != nil:
		// The kubelet expands only the static env into a probe's command.
		argv := make([]string, len(p.Exec.Command))
		for i, s := range p.Exec.Command {
			argv[i] = expand(s, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		}
		res, err := containerinit.Exec(ctx, sock, containerinit.ExecRequest{Argv: argv, Timeout: timeout})
		switch {
		case err != nil:
			return false, err.Error()
		case res.Error != "":
			return false, res.Error
		case res.ExitCode != 0:
			return false, fmt.Sprintf("command %q exited with %d: %s", argv, res.ExitCode, res.Output)
		}
		return true, ""
	case p.HTTPGet != nil:
		g := p.HTTPGet
		port, err := resolvePort(g.Port, ports)
		if err != nil {
			return false, err.Error()
		}
		host := ip
		if g.Host != "" {
			host = g.Host
		}
		scheme := strings.ToLower(string(g.Scheme))
		if scheme == "" {
			scheme = "http"
		}
		path := g.Path
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+net.JoinHostPort(host, strconv.Itoa(port))+path, nil)
		if err != nil {
			return false, err.Error()
		}
		req.Header.Set("User-Agent", "kube-probe/1.37")
		for _, h := range g.HTTPHeaders {
			req.Header.Add(h.Name, h.Value)
		}
		// The kubelet does not verify a probe's certificate, nor follow
		// redirects to other hosts; one client per probe keeps no pool.
		client := &http.Client{Timeout: timeout, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true,
		}}
		resp, err := client.Do(req)
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return false, fmt.Sprintf("HTTP probe failed with statuscode: %d", resp.StatusCode)
		}
		return true, ""
	case p.TCPSocket != nil:
		port, err := resolvePort(p.TCPSocket.Port, ports)
		if err != nil {
			return false, err.Error()
		}
		host := ip
		if p.TCPSocket.Host != "" {
			host = p.TCPSocket.Host
		}
		d := net.Dialer{Timeout: timeout}
		conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return false, err.Error()
		}
		conn.Close()
		return true, ""
	}
	return false, "probe type not modelled by the node agent (exec, httpGet and tcpSocket are)"
}

func resolvePort(p intstr.IntOrString, ports []corev1.ContainerPort) (int, error) {
	if p.Type == intstr.Int {
		return p.IntValue(), nil
	}
	for _, cp := range ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	if n, err := strconv.Atoi(p.StrVal); err == nil {
		return n, nil
	}
	return 0, fmt.Errorf("port %q: no such named port", p.StrVal)
}

// probeResult applies a result with the probe's thresholds; it returns
// true when a liveness probe has failed and the container must restart.
func (c *container) probeResult(k probeKind, ok bool) bool {
	p := c.probe(k)
	succ, fail := p.SuccessThreshold, p.FailureThreshold
	if succ <= 0 {
		succ = 1
	}
	if fail <= 0 {
		fail = 3
	}
	if ok {
		c.successes[k]++
		c.failures[k] = 0
	} else {
		c.failures[k]++
		c.successes[k] = 0
	}
	passed, failed := c.successes[k] >= int(succ), c.failures[k] >= int(fail)
	switch k {
	case startup:
		if passed {
			c.started = true
		}
		return failed && !c.started
	case readiness:
		if !c.started {
			return false
		}
		if passed {
			c.ready = true
		} else if failed {
			c.ready = false
		}
	case liveness:
		return c.started && failed
	}
	return false
}
