package docker

import (
	"net/http"
	"strings"
	"time"

	"github.com/moby/moby/api/types/network"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

// Stoke has no container networks: a Run's processes use the network of
// the pod they run in. The API lists one network, Docker's default
// "bridge", which every container is on, so that clients that look for
// it (testcontainers-go) find it; creating or joining others is refused.

// bridgeID is the one network's ID.
const bridgeID = "0000000000000000000000000000000000000000000000000000000000b1d9e0"

var serverStart = time.Now().UTC()

func bridgeNetwork() network.Network {
	return network.Network{Name: "bridge", ID: bridgeID, Created: serverStart, Scope: "local", Driver: "bridge",
		EnableIPv4: true, IPAM: network.IPAM{Driver: "default", Config: []network.IPAMConfig{}},
		Options: map[string]string{}, Labels: map[string]string{}}
}

// isBridge reports whether ref names the one network (name, ID or ID
// prefix).
func isBridge(ref string) bool {
	return ref == "bridge" || ref == "default" || (ref != "" && strings.HasPrefix(bridgeID, ref))
}

func (s *Server) networkList(w http.ResponseWriter, r *http.Request) {
	f, err := parseFiltersOf(r.URL.Query().Get("filters"), "name", "id", "driver", "scope", "type", "label", "dangling")
	if err != nil {
		writeError(w, err)
		return
	}
	n := bridgeNetwork()
	keep := true
	for k, vals := range f {
		ok := false
		for _, v := range vals {
			switch k {
			case "name":
				ok = ok || strings.Contains(n.Name, v)
			case "id":
				ok = ok || strings.HasPrefix(n.ID, v)
			case "driver":
				ok = ok || v == n.Driver
			case "scope":
				ok = ok || v == n.Scope
			case "type":
				ok = ok || v == "builtin"
			case "dangling":
				ok = ok || v == "false" || v == "0"
			}
		}
		keep = keep && ok
	}
	out := []network.Summary{}
	if keep {
		out = append(out, network.Summary{Network: n})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) networkInspect(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("id")
	if !isBridge(ref) {
		writeError(w, errdefs.Errorf(errdefs.ErrNotFound, "network %s not found", bounds.Truncate(ref, bounds.Quoted)))
		return
	}
	writeJSON(w, http.StatusOK, network.Inspect{Network: bridgeNetwork(), Containers: map[string]network.EndpointResource{}})
}

// networkCreate refuses: a Run uses its pod's network.
func (s *Server) networkCreate(w http.ResponseWriter, _ *http.Request) {
	writeError(w, errdefs.Errorf(errdefs.ErrUnimplemented, "networks are not supported on Stoke: a container uses the network of the pod its Run runs on (docs/docker.md)"))
}
