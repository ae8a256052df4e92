package gateway_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/gorilla/websocket"

	"stoke.dev/stoke/internal/exec/channel"
	"stoke.dev/stoke/internal/gateway"
)

// The Bearer scheme is case-insensitive (RFC 7235) on every authenticated
// endpoint: the object API, metrics, invoke and the exec upgrade.
func TestBearerSchemeInAnyCase(t *testing.T) {
	url := serve(t, gateway.Config{Exec: plane, Metrics: gateway.NewMetrics(plane.RunPhases)})
	fn := readyFunction(t, url, "bearer-case")
	for _, auth := range []string{"bearer " + token, "BEARER " + token, "Bearer  " + token} {
		t.Run(auth[:6], func(t *testing.T) {
			hdr := map[string]string{"Authorization": auth}
			if r := do(t, http.MethodGet, url+"/v1/runs", "", hdr); r.status != http.StatusOK {
				t.Errorf("list: %s", r)
			}
			if r := do(t, http.MethodGet, url+"/metrics", "", hdr); r.status != http.StatusOK {
				t.Errorf("metrics: %s", r)
			}
			if r := do(t, http.MethodPost, fn, `"x"`, hdr); r.status != http.StatusOK {
				t.Errorf("invoke: %s", r)
			}
			// Past authentication, the exec upgrade of a Run that does
			// not exist is 404.
			d := websocket.Dialer{Subprotocols: []string{channel.Protocol}}
			ws := "ws" + strings.TrimPrefix(url, "http") + "/v1/namespaces/default/runs/no-such-run/exec?command=true&stdout=true"
			conn, resp, err := d.Dial(ws, http.Header{"Authorization": {auth}})
			if err == nil {
				conn.Close()
				t.Fatal("upgraded")
			}
			if resp == nil || resp.StatusCode != http.StatusNotFound {
				t.Errorf("exec: %v %v", resp, err)
			}
		})
	}
	for _, auth := range []string{"Basic " + token, "Bearer" + token, "bearer", token} {
		if r := do(t, http.MethodGet, url+"/v1/runs", "", map[string]string{"Authorization": auth}); r.status != http.StatusUnauthorized {
			t.Errorf("%q: %s", auth, r)
		}
	}
}
