package gateway_test

import (
	"net/http"
	"strings"
	"testing"

	"stoke.dev/stoke/internal/gateway"
	"stoke.dev/stoke/internal/httpapi"
)

// The routes are matched once per request (the mux's catch-all takes
// what no route does); what no route takes keeps its answers: 401 before
// anything to a caller not authenticated, then 404, or 405 with Allow;
// a path the mux would clean that leads nowhere is 404, not a redirect,
// and one whose clean form is routed is redirected there, as before.
func TestUnroutedAnswers(t *testing.T) {
	url := serve(t, gateway.Config{})
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, tc := range []struct {
		name, method, path string
		auth               bool
		status             int
		errorType          string // "" when the answer is not an error body
		header, value      string // a header the answer must carry, with value in it
	}{
		{"unknown path, no token", http.MethodGet, "/v2/anything", false, 401, "Stoke.Unauthenticated", "WWW-Authenticate", "Bearer"},
		{"routed with another method, no token", http.MethodPut, "/v1/namespaces/default/runs/x/u/invoke", false, 401, "Stoke.Unauthenticated", httpapi.HeaderInvocationID, "inv_"},
		{"unknown path", http.MethodGet, "/v2/anything", true, 404, "Stoke.NotFound", "", ""},
		{"another method", http.MethodGet, "/v1/namespaces/default/runs/x/u/invoke", true, 405, "Stoke.Unimplemented", "Allow", "POST"},
		{"unclean path to nowhere", http.MethodGet, "//v2/anything", true, 404, "Stoke.NotFound", "", ""},
		{"unclean path to nowhere, no token", http.MethodGet, "/v2/./anything", false, 401, "Stoke.Unauthenticated", "", ""},
		{"unclean path to a route", http.MethodGet, "/v1//runs", true, http.StatusTemporaryRedirect, "", "Location", "/v1/runs"},
		{"a dot segment's name, routed", http.MethodGet, "/v1/namespaces/default/runs/.x", true, 404, "Stoke.NotFound", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, url+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.auth {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("%s %s: %d, want %d", tc.method, tc.path, resp.StatusCode, tc.status)
			}
			if tc.errorType != "" && !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
				t.Errorf("content type %q, want the JSON error body", resp.Header.Get("Content-Type"))
			}
			if tc.header != "" && !strings.Contains(resp.Header.Get(tc.header), tc.value) {
				t.Errorf("%s: %q, want %q in it", tc.header, resp.Header.Get(tc.header), tc.value)
			}
		})
	}
}
