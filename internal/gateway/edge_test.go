package gateway_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"stoke.dev/stoke/internal/gateway"
)

// Every route refuses a query parameter it does not take, one given
// twice, a malformed query, and a value it cannot read — with 400 and a
// message naming the parameter, as the Kubernetes API server does —
// rather than taking it for its default; and a refused write changes
// nothing.
func TestQueryParameters(t *testing.T) {
	url := serve(t, gateway.Config{})
	if r := do(t, http.MethodPost, url+"/v1/namespaces/default/runs", fmt.Sprintf(runJSON, "queried"), nil); r.status != http.StatusCreated {
		t.Fatalf("create: %s", r)
	}
	t.Cleanup(func() { _, _ = plane.DeleteRun(context.Background(), "default", "queried") })
	runs := "/v1/namespaces/default/runs"
	run := runs + "/queried"
	refused := []struct {
		name, method, path, body, param string
	}{
		{"NUL selector", http.MethodGet, runs + "?labelSelector=%00", "", "labelSelector"},
		{"selector ending in NUL", http.MethodGet, runs + "?labelSelector=a%3D%00", "", "labelSelector"},
		{"unknown phase", http.MethodGet, runs + "?phase=Nope", "", "phase"},
		{"empty phase in a list", http.MethodGet, runs + "?phase=Running,,Ready", "", "phase"},
		{"phase of runtimes", http.MethodGet, "/v1/runtimes?phase=Ready", "", "phase"},
		{"watch maybe", http.MethodGet, runs + "?watch=maybe", "", "watch"},
		{"watch twice", http.MethodGet, runs + "?watch=true&watch=false", "", "watch"},
		{"negative limit", http.MethodGet, runs + "?limit=-1", "", "limit"},
		{"limit not a number", http.MethodGet, "/v1/runs?limit=ten", "", "limit"},
		{"unknown on list", http.MethodGet, runs + "?fieldSelector=a", "", "fieldSelector"},
		{"unknown on watch", http.MethodGet, runs + "?watch=true&timeoutSeconds=5", "", "timeoutSeconds"},
		{"malformed query", http.MethodGet, runs + "?a=%zz", "", "query"},
		{"unknown on get", http.MethodGet, run + "?pretty=true", "", "pretty"},
		{"follow abc", http.MethodGet, run + "/logs?follow=abc", "", "follow"},
		{"unknown on logs", http.MethodGet, run + "/logs?tailLines=5", "", "tailLines"},
		{"unknown on delete", http.MethodDelete, run + "?gracePeriodSeconds=0", "", "gracePeriodSeconds"},
		{"unknown on cancel", http.MethodPost, run + "/cancel?now=1", "", "now"},
		{"unknown on patch", http.MethodPatch, run + "?dryRun=All", `{"metadata":{"labels":{"patched":"yes"}}}`, "dryRun"},
		{"unknown on create", http.MethodPost, runs + "?dryRun=All", fmt.Sprintf(runJSON, "dry"), "dryRun"},
		{"unknown on runtime get", http.MethodGet, "/v1/namespaces/default/runtimes/bash?x=1", "", "x"},
		{"unknown on runtime apply", http.MethodPut, "/v1/namespaces/default/runtimes/bash?x=1", `{"spec":{"server":"bash","replicas":1,"runs":4}}`, "x"},
		{"unknown on runtime delete", http.MethodDelete, "/v1/namespaces/default/runtimes/bash?x=1", "", "x"},
		{"unknown on runtime list", http.MethodGet, "/v1/namespaces/default/runtimes?x=1", "", "x"},
		{"unknown on invoke", http.MethodPost, run + "/0123-uid/invoke?async=true", `{}`, "async"},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			body := wantError(t, doRefused(t, tt.method, url+tt.path, tt.body), http.StatusBadRequest, "Stoke.InvalidArgument", false)
			if !strings.HasPrefix(body.ErrorMessage, tt.param+":") {
				t.Errorf("message %q does not name the parameter %s", body.ErrorMessage, tt.param)
			}
		})
	}
	// The refused writes did nothing.
	got := decodeRun(t, do(t, http.MethodGet, url+run, "", nil))
	if got.DeletionTimestamp != nil || got.Spec.CancelRequested || got.Labels["patched"] != "" {
		t.Errorf("a refused write changed the Run: %+v", got)
	}
	if r := do(t, http.MethodGet, url+runs+"/dry", "", nil); r.status != http.StatusNotFound {
		t.Errorf("a refused create stored the Run: %s", r)
	}
	if r := do(t, http.MethodGet, url+"/v1/namespaces/default/runtimes/bash", "", nil); r.status != http.StatusOK {
		t.Errorf("a refused delete removed the Runtime: %s", r)
	}

	taken := []string{
		runs + "?labelSelector=app%3Dx&phase=Pending,Running&limit=5",
		runs + "?watch=false&resourceVersion=1",
		"/v1/runtimes?watch=0&limit=0",
		run + "/logs?follow=false",
		run,
	}
	for _, path := range taken {
		if r := do(t, http.MethodGet, url+path, "", nil); r.status != http.StatusOK {
			t.Errorf("GET %s: %s", path, r)
		}
	}
}

// doRefused is do for a request that should be refused: an answer that is
// not an error (a watch or a followed log that was taken) is not read to
// its end, which may never come.
func doRefused(t *testing.T, method, url, body string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 400 {
		t.Fatalf("%s %s: %d, taken", method, url, resp.StatusCode)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, b}
}

// An object body that is not valid UTF-8 is refused, as an invoke body
// is, rather than stored with U+FFFD in place of its bytes.
func TestObjectBodyMustBeUTF8(t *testing.T) {
	url := serve(t, gateway.Config{})
	runs := url + "/v1/namespaces/default/runs"
	bad := strings.Replace(fmt.Sprintf(runJSON, "latin1"), `"metadata":{`, `"metadata":{"annotations":{"note":"caf`+"\xe9"+`"},`, 1)
	body := wantError(t, do(t, http.MethodPost, runs, bad, nil), http.StatusBadRequest, "Stoke.InvalidArgument", false)
	if !strings.Contains(body.ErrorMessage, "UTF-8") {
		t.Errorf("message %q does not say UTF-8", body.ErrorMessage)
	}
	if r := do(t, http.MethodGet, runs+"/latin1", "", nil); r.status != http.StatusNotFound {
		t.Fatalf("the refused Run was stored: %s", r)
	}
	yaml := map[string]string{"Content-Type": "application/yaml"}
	wantError(t, do(t, http.MethodPost, runs, strings.Replace(runYAML("latin1"), "name: latin1", "name: latin1\n  annotations: {note: caf\xe9}", 1), yaml),
		http.StatusBadRequest, "Stoke.InvalidArgument", false)
	wantError(t, do(t, http.MethodPut, url+"/v1/namespaces/default/runtimes/bash", `{"metadata":{"annotations":{"n":"\xff"}},"spec":{"server":"bash","replicas":1,"runs":4}}`, nil),
		http.StatusBadRequest, "Stoke.InvalidArgument", false)

	if r := do(t, http.MethodPost, runs, fmt.Sprintf(runJSON, "utf8"), nil); r.status != http.StatusCreated {
		t.Fatalf("create: %s", r)
	}
	t.Cleanup(func() { _, _ = plane.DeleteRun(context.Background(), "default", "utf8") })
	wantError(t, do(t, http.MethodPatch, runs+"/utf8", `{"metadata":{"annotations":{"note":"caf`+"\xe9"+`"}}}`, nil),
		http.StatusBadRequest, "Stoke.InvalidArgument", false)
	if got := decodeRun(t, do(t, http.MethodGet, runs+"/utf8", "", nil)); len(got.Annotations) != 0 {
		t.Errorf("the refused patch was applied: %v", got.Annotations)
	}
}
