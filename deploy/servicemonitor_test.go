package deploy

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// monitorEndpoint is the part of a ServiceMonitor endpoint this test reads.
type monitorEndpoint struct {
	Port   string `json:"port"`
	Scheme string `json:"scheme"`
	Path   string `json:"path"`
}

type serviceMonitor struct {
	Kind string `json:"kind"`
	Spec struct {
		Selector struct {
			MatchExpressions []struct {
				Key      string   `json:"key"`
				Operator string   `json:"operator"`
				Values   []string `json:"values"`
			} `json:"matchExpressions"`
		} `json:"selector"`
		Endpoints []monitorEndpoint `json:"endpoints"`
	} `json:"spec"`
}

// The ServiceMonitor's endpoints are what the components really serve:
// each endpoint's port is a port of a Service it selects, that port leads
// to a container port of the Deployment behind the Service, and the
// container serves HTTPS /metrics there (the flag that sets the address
// names that port). Each of the controller and the gateway is scraped by
// one endpoint; runtimed's metrics are on the gateway's /metrics (the hop's
// metrics.v1, scraped over mutual TLS), so no endpoint reaches a runtime
// Pod and the NetworkPolicy keeps them closed to all but the gateway.
func TestServiceMonitorScrapesWhatIsServed(t *testing.T) {
	ms, err := Render("stoke-system", map[string]any{"serviceMonitor": map[string]any{"enabled": true}})
	if err != nil {
		t.Fatal(err)
	}
	var monitor *serviceMonitor
	var services []*corev1.Service
	var deployments []*appsv1.Deployment
	var policies []string
	for _, m := range ms {
		var head struct{ Kind string }
		if err := yaml.Unmarshal([]byte(m.Content), &head); err != nil {
			t.Fatalf("%s: %v", m.Template, err)
		}
		var obj any
		switch head.Kind {
		case "ServiceMonitor":
			monitor = &serviceMonitor{}
			obj = monitor
		case "Service":
			s := &corev1.Service{}
			services, obj = append(services, s), s
		case "Deployment":
			d := &appsv1.Deployment{}
			deployments, obj = append(deployments, d), d
		case "NetworkPolicy":
			policies = append(policies, m.Content)
			continue
		default:
			continue
		}
		if err := yaml.Unmarshal([]byte(m.Content), obj); err != nil {
			t.Fatalf("%s: %v", m.Template, err)
		}
	}
	if monitor == nil {
		t.Fatal("serviceMonitor.enabled=true renders no ServiceMonitor")
	}
	selected := func(s *corev1.Service) bool {
		for _, e := range monitor.Spec.Selector.MatchExpressions {
			if e.Operator != "In" || !slices.Contains(e.Values, s.Labels[e.Key]) {
				return false
			}
		}
		return len(monitor.Spec.Selector.MatchExpressions) > 0
	}
	// The flag that sets each component's HTTPS address.
	listenFlags := map[string]string{"controller": "--metrics-bind-address=", "gateway": "--listen="}
	scraped := map[string]bool{}
	for _, ep := range monitor.Spec.Endpoints {
		if ep.Scheme != "https" || ep.Path != "/metrics" {
			t.Errorf("endpoint %+v: the components serve HTTPS /metrics", ep)
		}
		found := false
		for _, s := range services {
			if !selected(s) {
				continue
			}
			for _, sp := range s.Spec.Ports {
				if sp.Name != ep.Port {
					continue
				}
				found = true
				d := backing(deployments, s)
				if d == nil {
					t.Errorf("service %s: no Deployment behind it", s.Name)
					continue
				}
				c, port, err := containerPort(d, sp.TargetPort.String())
				if err != nil {
					t.Errorf("service %s port %s: %v", s.Name, sp.Name, err)
					continue
				}
				flag := listenFlags[c.Name]
				if !slices.ContainsFunc(c.Args, func(a string) bool {
					return strings.HasPrefix(a, flag) && strings.HasSuffix(a, fmt.Sprintf(":%d", port))
				}) || flag == "" {
					t.Errorf("service %s port %s leads to %s:%d, where container %s serves nothing (args %v)", s.Name, sp.Name, d.Name, port, c.Name, c.Args)
					continue
				}
				scraped[c.Name] = true
			}
		}
		if !found {
			t.Errorf("endpoint port %q is no port of a Service the ServiceMonitor selects", ep.Port)
		}
	}
	for _, c := range []string{"controller", "gateway"} {
		if !scraped[c] {
			t.Errorf("the ServiceMonitor does not scrape the %s", c)
		}
	}
	// runtimed's metrics come through the gateway: the runtime Pods'
	// NetworkPolicy admits the gateway alone, on the hop's port alone.
	for _, p := range policies {
		if !strings.Contains(p, "app.kubernetes.io/name: stoke-gateway") || strings.Count(p, "- port:") != 1 || !strings.Contains(p, "- port: 7443") {
			t.Errorf("the runtime Pods' NetworkPolicy admits more than the gateway on the hop:\n%s", p)
		}
	}
	if len(policies) == 0 {
		t.Error("no NetworkPolicy rendered")
	}
}

// backing is the Deployment whose Pods s selects.
func backing(deployments []*appsv1.Deployment, s *corev1.Service) *appsv1.Deployment {
	sel := labels.SelectorFromSet(s.Spec.Selector)
	for _, d := range deployments {
		if d.Namespace == s.Namespace && sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			return d
		}
	}
	return nil
}

// containerPort finds the container and port number a Service's
// targetPort (a name or a number) names in d.
func containerPort(d *appsv1.Deployment, target string) (*corev1.Container, int32, error) {
	for i := range d.Spec.Template.Spec.Containers {
		c := &d.Spec.Template.Spec.Containers[i]
		for _, p := range c.Ports {
			if p.Name == target || fmt.Sprint(p.ContainerPort) == target {
				return c, p.ContainerPort, nil
			}
		}
	}
	return nil, 0, fmt.Errorf("deployment %s has no container port %q", d.Name, target)
}
