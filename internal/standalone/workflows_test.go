package standalone_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/gateway"
)

// do sends a JSON body (or none) with the test token.
func do(t *testing.T, method, url, body string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Content-Type", "application/yaml")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.WriteString(string(buf[:n]))
		if err != nil {
			break
		}
	}
	return reply{resp.StatusCode, resp.Header, []byte(b.String())}
}

const goodWorkflowRun = `apiVersion: stoke.dev/v1alpha1
kind: WorkflowRun
metadata: {name: ci}
spec:
  jobs:
  - id: build
    runsOn: bash
    steps:
    - {id: b, run: 'echo v=1 >> "$GITHUB_OUTPUT"'}
    outputs: [{name: v, value: '${{ steps.b.outputs.v }}'}]
  - id: test
    needs: [build]
    runsOn: bash
    strategy: {matrix: {axes: [{name: shard, values: [1, 2, 3]}]}}
    steps:
    - run: echo "$V"
      env: [{name: V, value: '${{ needs.build.outputs.v }}-${{ matrix.shard }}'}]
`

// The HTTP API refuses each bad WorkflowRun and Workflow the issue names
// with a 400 whose message names the field, and stores nothing; a good
// one is created, cancelled and deleted.
func TestWorkflowAPI(t *testing.T) {
	p := start(t)
	srv := httptest.NewServer(gateway.New(gateway.Config{API: p, Token: testToken}))
	defer srv.Close()
	runs := srv.URL + "/v1/namespaces/default/workflowruns"
	wfs := srv.URL + "/v1/namespaces/default/workflows"

	lib := "apiVersion: stoke.dev/v1alpha1\nkind: Workflow\nmetadata: {name: NAME}\nspec:\n  inputs: [{name: count, type: number, required: true}]\n  jobs:\n  - {id: one, runsOn: bash, steps: [{run: 'true'}]}\n"
	if r := do(t, http.MethodPut, wfs+"/lib", strings.Replace(lib, "NAME", "lib", 1)); r.status != http.StatusOK {
		t.Fatalf("apply Workflow lib: %d %s", r.status, r.body)
	}
	loop := "apiVersion: stoke.dev/v1alpha1\nkind: Workflow\nmetadata: {name: loop}\nspec:\n  jobs:\n  - {id: again, uses: loop}\n"

	for _, tt := range []struct {
		name, url, method, body, want string
	}{
		{"cycle", runs, http.MethodPost, strings.Replace(goodWorkflowRun, "id: build\n", "id: build\n    needs: [test]\n", 1), "spec.jobs: needs form a cycle: build → test → build"},
		{"unknown needs", runs, http.MethodPost, strings.Replace(goodWorkflowRun, "needs: [build]", "needs: [biuld]", 1), `spec.jobs[1].needs[0]: no job \"biuld\" in this workflow`},
		{"unknown uses", runs, http.MethodPost, strings.Replace(goodWorkflowRun, "- {id: b, run: 'echo v=1 >> \"$GITHUB_OUTPUT\"'}", "- {uses: actions/cache@v4}\n    - {id: b, run: 'true'}", 1), `spec.jobs[0].steps[0].uses: \"actions/cache@v4\" is not a step Stoke knows`},
		{"expression does not parse", runs, http.MethodPost, strings.Replace(goodWorkflowRun, "${{ matrix.shard }}", "${{ matrix.shard ", 1), "spec.jobs[1].steps[0].env[0].value: an expression does not parse"},
		{"matrix over the bound", runs, http.MethodPost, strings.Replace(goodWorkflowRun, "[1, 2, 3]", "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]}, {name: b, values: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]", 1), "spec.jobs[1].strategy.matrix: axes: the product of the axes is over the bound of 256 combinations"},
		{"unknown Workflow", runs, http.MethodPost, goodWorkflowRun + "  - {id: call, uses: nope}\n", `spec.jobs[2].uses: no Workflow \"nope\" in namespace \"default\"`},
		{"call without its input", runs, http.MethodPost, goodWorkflowRun + "  - {id: call, uses: lib}\n", `spec.jobs[2].with: Workflow \"lib\" needs input \"count\"`},
		{"Workflow calling itself", wfs + "/loop", http.MethodPut, loop, "spec.jobs[0].uses: Workflow calls form a cycle: loop → loop"},
		{"unknown field", runs, http.MethodPost, strings.Replace(goodWorkflowRun, "runsOn: bash", "runs-on: bash", 1), `unknown field \"runs-on\"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := do(t, tt.method, tt.url, tt.body)
			if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), tt.want) {
				t.Fatalf("got %d %s, want 400 with %q", r.status, r.body, tt.want)
			}
		})
	}
	var list v1alpha1.WorkflowRunList
	if r := do(t, http.MethodGet, runs, ""); r.status != http.StatusOK || json.Unmarshal(r.body, &list) != nil || len(list.Items) != 0 {
		t.Fatalf("after the refusals, the list: %d %s, want none stored", r.status, r.body)
	}
	if r := do(t, http.MethodGet, wfs+"/loop", ""); r.status != http.StatusNotFound {
		t.Fatalf("the refused Workflow: %d %s, want 404", r.status, r.body)
	}

	r := do(t, http.MethodPost, runs, goodWorkflowRun)
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	r = do(t, http.MethodPost, runs+"/ci/cancel", "")
	var got v1alpha1.WorkflowRun
	if r.status != http.StatusOK || json.Unmarshal(r.body, &got) != nil || !got.Spec.CancelRequested {
		t.Fatalf("cancel: %d %s", r.status, r.body)
	}
	if r := do(t, http.MethodDelete, runs+"/ci", ""); r.status != http.StatusAccepted {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
}
