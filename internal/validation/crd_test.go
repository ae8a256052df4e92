package validation

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	k8svalidation "k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"stoke.dev/stoke/internal/bounds"
)

// dnsLabel is the longest DNS-1123 label: a Runtime's name and a Run's
// spec.runtime.
const dnsLabel = int64(k8svalidation.DNS1123LabelMaxLength)

// crdBounds are the limits the generated CRDs must state, keyed by schema
// path and keyword: "spec.env maxItems", "spec.mode.task.args[] maxLength"
// (an array's items), "status.outputs rules" (the numbers compared with <=
// or >= in that node's CEL rules, in order). Markers take literals; this
// table is where each literal meets its constant.
var crdBounds = map[string]map[string][]int64{
	"stoke.dev_runs.yaml": {
		"spec.runtime maxLength":                        {dnsLabel},
		"spec.env maxItems":                             {bounds.EnvEntries},
		"spec.mode.task.entrypoint maxLength":           {bounds.Path},
		"spec.mode.task.args maxItems":                  {bounds.Args},
		"spec.mode.task.args[] maxLength":               {bounds.Arg},
		"spec.mode.task.args rules":                     {bounds.Arg},
		"spec.mode.function.handler maxLength":          {bounds.Handler},
		"spec.mode.function.handler rules":              {bounds.Handler},
		"spec.source.inline.path maxLength":             {bounds.Path},
		"spec.source.inline.text maxLength":             {bounds.Source},
		"spec.source.inline.text rules":                 {bounds.Source},
		"spec.source.archive.tarGz maxLength":           {int64(base64.StdEncoding.EncodedLen(bounds.Source))},
		"spec.source.archive.tarGz rules":               {bounds.Source},
		"spec.source.git.url maxLength":                 {bounds.GitURL},
		"spec.source.git.ref maxLength":                 {bounds.GitRef},
		"spec.source.git.path maxLength":                {bounds.Path},
		"spec.source.git.credentialsSecret maxLength":   {maxSecretName},
		"spec.placement.podUID maxLength":               {bounds.PlacementName},
		"spec.mode.task.ttySize.width maximum":          {maxTerminalSide},
		"spec.mode.task.ttySize.height maximum":         {maxTerminalSide},
		"spec.placement.workspace maxLength":            {bounds.PlacementName},
		"status.env maxItems":                           {bounds.OutputKeys},
		"status.sourceCommit maxLength":                 {maxCommitID},
		"spec.retryPolicy.maxAttempts maximum":          {bounds.RetryAttempts},
		"spec.retryPolicy.retryableReasons[] maxLength": {maxConditionReason},
		"status.message maxLength":                      {bounds.Message},
		"status.summary maxLength":                      {bounds.StepSummaryStored},
		"status.outputs maxProperties":                  {bounds.OutputKeys},
		"status.outputs rules":                          {bounds.OutputKey, bounds.OutputValue},
	},
	"stoke.dev_runtimes.yaml": {
		"spec.git.credentialsSecret maxLength":       {maxSecretName},
		" rules":                                     {dnsLabel},
		"spec.replicas maximum":                      {bounds.RuntimeReplicas},
		"spec.runs maximum":                          {bounds.RuntimeRuns},
		"spec.lambda.role maxLength":                 {maxRoleARN},
		"spec.lambda.memoryMB rules":                 {minLambdaMemMB, maxLambdaMemMB},
		"spec.lambda.namePrefix maxLength":           {maxNamePrefix},
		"spec.lambda.bootstrap maxLength":            {bounds.Path},
		"spec.lambda.image maxLength":                {maxImageURI},
		"spec.template.image maxLength":              {bounds.Path},
		"spec.template.env maxItems":                 {bounds.EnvEntries},
		"spec.template.volumes maxItems":             {maxTemplateVolumes},
		"spec.template.volumeMounts maxItems":        {maxTemplateVolumes},
		"spec.template.tolerations maxItems":         {maxTemplateList},
		"spec.template.imagePullSecrets maxItems":    {maxTemplateList},
		"spec.template.priorityClassName maxLength":  {maxPriorityClass},
		"spec.template.serviceAccountName maxLength": {maxServiceAccountName},
		"spec.lambda.agentListen maxLength":          {maxAgentListen},
		"spec.lambda.agentURL maxLength":             {maxAgentURL},
		"spec.lambda.agentCert maxLength":            {bounds.Path},
		"spec.lambda.agentKey maxLength":             {bounds.Path},
	},
	"stoke.dev_functions.yaml": {
		" rules":                                      {dnsLabel},
		"spec.runtime maxLength":                      {dnsLabel},
		"spec.handler maxLength":                      {bounds.Handler},
		"spec.handler rules":                          {bounds.Handler},
		"spec.env maxItems":                           {bounds.EnvEntries},
		"spec.source.inline.path maxLength":           {bounds.Path},
		"spec.source.inline.text maxLength":           {bounds.Source},
		"spec.source.inline.text rules":               {bounds.Source},
		"spec.source.archive.tarGz maxLength":         {int64(base64.StdEncoding.EncodedLen(bounds.Source))},
		"spec.source.archive.tarGz rules":             {bounds.Source},
		"spec.source.git.url maxLength":               {bounds.GitURL},
		"spec.source.git.ref maxLength":               {bounds.GitRef},
		"spec.source.git.path maxLength":              {bounds.Path},
		"spec.source.git.credentialsSecret maxLength": {maxSecretName},
		"spec.replicas maximum":                       {bounds.FunctionReplicas},
		"spec.scale.min maximum":                      {bounds.FunctionReplicas},
		"spec.scale.max maximum":                      {bounds.FunctionReplicas},
		"spec.scale.targetInFlight maximum":           {bounds.FunctionTargetInFlight},
		"spec.scale.idleSeconds maximum":              {bounds.FunctionIdleSeconds},
		"spec.queue.length maximum":                   {bounds.MaxFunctionQueue},
		"spec.drainSeconds maximum":                   {bounds.FunctionDrainSeconds},
		"status.lastScale.reason maxLength":           {bounds.ScaleReason},
	},
}

// maxSecretName is a Secret's name's bound (a DNS-1123 subdomain);
// maxCommitID a SHA-256 commit ID's length.
const (
	maxSecretName = int64(k8svalidation.DNS1123SubdomainMaxLength)
	maxCommitID   = 64
)

// TestCRDMatchesBounds reads the generated CRDs and checks that every
// upper bound they state — maxLength, maxItems, maxProperties, maximum and
// the numbers in CEL comparisons — is in crdBounds with the value of its
// constant, and that every crdBounds entry is in the CRD. metav1.Condition's
// own bounds (status.conditions) are apimachinery's and are skipped.
func TestCRDMatchesBounds(t *testing.T) {
	for file, want := range crdBounds {
		t.Run(file, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "crds", file))
			if err != nil {
				t.Fatal(err)
			}
			var crd struct {
				Spec struct {
					Versions []struct {
						Schema struct {
							OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
						} `json:"schema"`
					} `json:"versions"`
				} `json:"spec"`
			}
			if err := yaml.Unmarshal(b, &crd); err != nil {
				t.Fatal(err)
			}
			if len(crd.Spec.Versions) != 1 {
				t.Fatalf("%d versions, want 1", len(crd.Spec.Versions))
			}
			got := map[string][]int64{}
			collectBounds(t, crd.Spec.Versions[0].Schema.OpenAPIV3Schema, "", got)
			keys := make([]string, 0, len(got)+len(want))
			for k := range got {
				keys = append(keys, k)
			}
			for k := range want {
				if _, ok := got[k]; !ok {
					keys = append(keys, k)
				}
			}
			sort.Strings(keys)
			for _, k := range keys {
				g, inCRD := got[k]
				w, inTable := want[k]
				switch {
				case !inTable:
					t.Errorf("%s: %v is in the CRD but not in crdBounds: add it with the constant it stands for", k, g)
				case !inCRD:
					t.Errorf("%s: want %v, not in the CRD: add the marker in api/stoke/v1alpha1 and run make generate", k, w)
				case !slices.Equal(g, w):
					t.Errorf("%s: the CRD says %v, the constants say %v: fix the marker in api/stoke/v1alpha1 and run make generate", k, g, w)
				}
			}
		})
	}
}

// ruleBound finds the numbers a CEL rule compares with <= or >=.
var ruleBound = regexp.MustCompile(`[<>]=\s*(\d+)`)

// collectBounds walks an OpenAPI schema node at path p into out.
func collectBounds(t *testing.T, node map[string]any, p string, out map[string][]int64) {
	t.Helper()
	if p == "status.conditions" {
		return
	}
	for _, kw := range []string{"maxLength", "maxItems", "maxProperties", "maximum"} {
		if v, ok := node[kw]; ok {
			n, ok := v.(float64)
			if !ok {
				t.Fatalf("%s %s is %T", p, kw, v)
			}
			out[p+" "+kw] = []int64{int64(n)}
		}
	}
	rules, _ := node["x-kubernetes-validations"].([]any)
	for _, r := range rules {
		rule, _ := r.(map[string]any)["rule"].(string)
		for _, m := range ruleBound.FindAllStringSubmatch(rule, -1) {
			n, err := strconv.ParseInt(m[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			out[p+" rules"] = append(out[p+" rules"], n)
		}
	}
	props, _ := node["properties"].(map[string]any)
	for name, child := range props {
		collectBounds(t, child.(map[string]any), strings.TrimPrefix(p+"."+name, "."), out)
	}
	if items, ok := node["items"].(map[string]any); ok {
		collectBounds(t, items, p+"[]", out)
	}
	if add, ok := node["additionalProperties"].(map[string]any); ok {
		collectBounds(t, add, p+"{}", out)
	}
}

func TestCollectBoundsFindsRuleNumbers(t *testing.T) {
	out := map[string][]int64{}
	collectBounds(t, map[string]any{"properties": map[string]any{"a": map[string]any{
		"maxLength":                float64(7),
		"x-kubernetes-validations": []any{map[string]any{"rule": "self == 0 || (self >= 128 && self <= 10240)"}},
	}}}, "", out)
	if got := fmt.Sprint(out); got != "map[a maxLength:[7] a rules:[128 10240]]" {
		t.Fatalf("got %s", got)
	}
}
