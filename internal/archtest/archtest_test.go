package archtest

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

type pkg struct {
	ImportPath   string
	Dir          string
	GoFiles      []string
	TestGoFiles  []string
	XTestGoFiles []string
	Doc          string
	Imports      []string
	Deps         []string
	Name         string
}

func listPackages(t *testing.T) []pkg {
	out, err := exec.Command("go", "list", "-e", "-json", "stoke.dev/stoke/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func TestEveryPackageHasADocComment(t *testing.T) {
	for _, p := range listPackages(t) {
		if p.Doc == "" {
			t.Errorf("%s has no package doc comment", p.ImportPath)
		}
	}
}

// forbidden lists import prefixes a package (prefix) must not use.
var forbidden = map[string][]string{
	"stoke.dev/stoke/api/":             {"stoke.dev/stoke/internal/"},
	"stoke.dev/stoke/internal/errdefs": {"stoke.dev/stoke/internal/"},
	"stoke.dev/stoke/internal/bounds":  {"stoke.dev/stoke/internal/"},
	// The dispatcher knows no store and no transport: its caller feeds it
	// replicas and calls the one leased.
	"stoke.dev/stoke/internal/dispatch": {"stoke.dev/stoke/internal/store", "stoke.dev/stoke/internal/gateway", "stoke.dev/stoke/internal/informer", "stoke.dev/stoke/internal/runtime", "stoke.dev/stoke/api/", "google.golang.org/grpc", "net/", "k8s.io/client-go"},
	// The log summariser is a leaf anything with a flood of per-request
	// lines may use.
	"stoke.dev/stoke/internal/logsummary": {"stoke.dev/stoke/internal/"},
	// The Run log format is shared by the Runtime Server (writer) and
	// stoke up (reader): it depends on neither.
	"stoke.dev/stoke/internal/runlog": {"stoke.dev/stoke/internal/runtime", "stoke.dev/stoke/internal/pool", "stoke.dev/stoke/internal/standalone", "stoke.dev/stoke/internal/gateway", "stoke.dev/stoke/internal/store"},
	// cgroup is a leaf: pool, up and the runtime use it, never the reverse.
	"stoke.dev/stoke/internal/cgroup": {"stoke.dev/stoke/internal/"},
	// The Runs' user is a leaf too: the Runtime Server, the pool and the
	// data directory use it.
	"stoke.dev/stoke/internal/runuser": {"stoke.dev/stoke/internal/"},
	// The one tar entry check knows only the bounds and the errors.
	"stoke.dev/stoke/internal/tarsafe": {"stoke.dev/stoke/internal/store", "stoke.dev/stoke/internal/runtime", "stoke.dev/stoke/internal/podcopy", "stoke.dev/stoke/internal/gitsource", "stoke.dev/stoke/internal/runtimed", "stoke.dev/stoke/internal/artifact", "stoke.dev/stoke/api/"},
	// The caches' one eviction policy is a leaf.
	"stoke.dev/stoke/internal/cacheprune": {"stoke.dev/stoke/internal/"},
	// The requirements cache is a leaf the Python adapter uses.
	"stoke.dev/stoke/internal/pydeps":         {"stoke.dev/stoke/internal/runtime", "stoke.dev/stoke/internal/lambda", "stoke.dev/stoke/internal/standalone", "stoke.dev/stoke/internal/store"},
	"stoke.dev/stoke/internal/proc":           {"stoke.dev/stoke/internal/runtime"},
	"stoke.dev/stoke/internal/runtime/bash":   {"stoke.dev/stoke/internal/runtime/server", "stoke.dev/stoke/internal/runtime/python"},
	"stoke.dev/stoke/internal/runtime/python": {"stoke.dev/stoke/internal/runtime/server", "stoke.dev/stoke/internal/runtime/bash"},
	"stoke.dev/stoke/internal/store":          {"stoke.dev/stoke/internal/runtime", "stoke.dev/stoke/internal/gateway"},
	"stoke.dev/stoke/internal/retry":          {"stoke.dev/stoke/internal/store", "stoke.dev/stoke/internal/runtime"},
	// Each store implementation knows the contract, never the other one;
	// the conformance suite knows neither.
	"stoke.dev/stoke/internal/store/sqlite":    {"stoke.dev/stoke/internal/store/kube"},
	"stoke.dev/stoke/internal/store/kube":      {"stoke.dev/stoke/internal/store/sqlite"},
	"stoke.dev/stoke/internal/store/storetest": {"stoke.dev/stoke/internal/store/sqlite", "stoke.dev/stoke/internal/store/kube"},
	// Metrics over gRPC know neither who serves them nor who scrapes.
	"stoke.dev/stoke/internal/metricsrpc": {"stoke.dev/stoke/internal/runtime", "stoke.dev/stoke/internal/standalone", "stoke.dev/stoke/internal/gateway"},
	// The loop kit is below every control loop: it knows keys, a clock
	// and goroutines, nothing of Runs, stores, processes or Kubernetes.
	"stoke.dev/stoke/internal/loop": {"stoke.dev/stoke/internal/", "k8s.io/client-go", "k8s.io/api", "modernc.org/sqlite", "os/exec"},
	// The Function controller is a control loop like the reaper: it knows
	// the store interface and the informers, no gateway or dispatcher
	// (a hook tells it what the dispatcher knows), no process.
	"stoke.dev/stoke/internal/functionset": {"stoke.dev/stoke/internal/gateway", "stoke.dev/stoke/internal/dispatch", "stoke.dev/stoke/internal/runtime", "stoke.dev/stoke/internal/standalone", "stoke.dev/stoke/internal/proc", "os/exec"},
	// The workflow controller is a control loop like the Function
	// controller: the store interface, the informers, the loop kit, the
	// retry engine and the expression language; it starts no process
	// and reaches pods only through Runs (and the Artifacts hook).
	"stoke.dev/stoke/internal/workflow": {"stoke.dev/stoke/internal/gateway", "stoke.dev/stoke/internal/dispatch", "stoke.dev/stoke/internal/runtime", "stoke.dev/stoke/internal/standalone", "stoke.dev/stoke/internal/proc", "stoke.dev/stoke/internal/podcopy", "os/exec"},
	// hashFiles() hashes a directory; it runs in a hash Run, on a pod.
	"stoke.dev/stoke/internal/hashfiles": {"stoke.dev/stoke/internal/store", "stoke.dev/stoke/internal/runtime", "stoke.dev/stoke/internal/workflow", "stoke.dev/stoke/internal/wfexpr", "os/exec"},
	// The workflow expression language evaluates; it knows the API types
	// and bounds, nothing that stores, schedules or runs.
	"stoke.dev/stoke/internal/wfexpr": {"stoke.dev/stoke/internal/store", "stoke.dev/stoke/internal/runtime", "stoke.dev/stoke/internal/workflow", "stoke.dev/stoke/internal/validation", "os/exec"},
	// The GitHub Actions converter makes a spec; it runs nothing.
	"stoke.dev/stoke/internal/wfconvert": {"stoke.dev/stoke/internal/store", "stoke.dev/stoke/internal/runtime", "stoke.dev/stoke/internal/workflow", "os/exec"},
	// The exec core is below the Runtime Server, runtimed and the gateway,
	// which all reuse it.
	"stoke.dev/stoke/internal/exec": {"stoke.dev/stoke/internal/runtime", "stoke.dev/stoke/internal/runtimed", "stoke.dev/stoke/internal/gateway", "stoke.dev/stoke/internal/standalone", "stoke.dev/stoke/internal/store"},
	// The gateway talks to the control plane through its API interface
	// (store types only), never to a store implementation; the invoke
	// path reads memory.
	"stoke.dev/stoke/internal/gateway": {"stoke.dev/stoke/internal/store/", "stoke.dev/stoke/internal/standalone"},
	// The Docker API is a front door like the gateway: it reaches the
	// control plane through its Backend interface and the Exec service,
	// never a store, a pod or a Runtime Server directly, so that it can
	// serve Kubernetes mode too.
	"stoke.dev/stoke/internal/docker": {"stoke.dev/stoke/internal/store/", "stoke.dev/stoke/internal/standalone", "stoke.dev/stoke/internal/pool", "stoke.dev/stoke/internal/runtime", "stoke.dev/stoke/internal/up"},
	// Copying through exec knows the Exec service only: docker cp and
	// workflow artifacts use it, it uses neither, nor a store or a pod.
	"stoke.dev/stoke/internal/podcopy": {"stoke.dev/stoke/internal/store", "stoke.dev/stoke/internal/docker", "stoke.dev/stoke/internal/artifact", "stoke.dev/stoke/internal/standalone", "stoke.dev/stoke/internal/gateway", "stoke.dev/stoke/internal/runtime"},
	// The artifact store knows its backends and the Exec service (through
	// podcopy): the workflow engine and the front doors call it, never
	// the reverse, and it reads no Run or WorkflowRun store.
	"stoke.dev/stoke/internal/artifact": {"stoke.dev/stoke/internal/store", "stoke.dev/stoke/internal/standalone", "stoke.dev/stoke/internal/up", "stoke.dev/stoke/internal/gateway", "stoke.dev/stoke/internal/workflow", "stoke.dev/stoke/internal/runtime", "stoke.dev/stoke/internal/docker"},
	// The git cache fetches and unpacks commits: it knows no Run, store,
	// pod or Runtime Server (runtimed calls it), and its test server
	// only git.
	"stoke.dev/stoke/internal/gitsource": {"stoke.dev/stoke/internal/store", "stoke.dev/stoke/internal/runtime", "stoke.dev/stoke/internal/runtimed", "stoke.dev/stoke/internal/standalone", "stoke.dev/stoke/internal/pool", "stoke.dev/stoke/internal/scheduler", "stoke.dev/stoke/api/"},
	// The Kubernetes gateway is the gateway's code behind Kubernetes
	// authorization and informers: nothing of standalone mode.
	"stoke.dev/stoke/internal/kubegateway": {"stoke.dev/stoke/internal/standalone", "stoke.dev/stoke/internal/store/sqlite", "stoke.dev/stoke/internal/pool", "stoke.dev/stoke/internal/up"},
	// The gateways' load records are Kubernetes plumbing between the
	// gateway and the autoscaler: they know Leases and loads, neither end.
	"stoke.dev/stoke/internal/loadreport": {"stoke.dev/stoke/internal/gateway", "stoke.dev/stoke/internal/kubegateway", "stoke.dev/stoke/internal/dispatch", "stoke.dev/stoke/internal/autoscaler", "stoke.dev/stoke/internal/controlplane", "stoke.dev/stoke/internal/store"},
	// runtimed's mutual TLS is a leaf both of its ends (runtimed, the
	// gateway) use; the sidecar is Kubernetes wiring of runtimed and knows
	// neither the local pod supervisor, SQLite nor the standalone wiring.
	"stoke.dev/stoke/internal/mtls":    {"stoke.dev/stoke/internal/"},
	"stoke.dev/stoke/internal/sidecar": {"stoke.dev/stoke/internal/pool", "stoke.dev/stoke/internal/store/sqlite", "stoke.dev/stoke/internal/standalone"},
	// The Lambda wire format stands alone; the bootstrap inside the
	// sandbox knows the core and its adapters but no server or control plane.
	"stoke.dev/stoke/internal/lambda/payload": {"stoke.dev/stoke/internal/"},
	// The small bootstrap binary is the bootstrap package alone: nothing of
	// the control plane, the CLI or Kubernetes goes into Lambda packages
	// (TestThePackagedBootstrapLeavesRoom holds its size).
	"stoke.dev/stoke/cmd/stoke-lambda-bootstrap": {"stoke.dev/stoke/internal/runtime/server", "stoke.dev/stoke/internal/runtimed", "stoke.dev/stoke/internal/store", "stoke.dev/stoke/internal/standalone", "stoke.dev/stoke/internal/cli", "stoke.dev/stoke/internal/kube", "k8s.io/", "helm.sh/", "sigs.k8s.io/"},
	"stoke.dev/stoke/internal/lambda/bootstrap":  {"stoke.dev/stoke/internal/runtime/server", "stoke.dev/stoke/internal/runtimed", "stoke.dev/stoke/internal/store", "stoke.dev/stoke/internal/lambda/lambdasim"},
	// The CA knows certificates and Secrets, nothing of Runs, pods or
	// processes; the Runtime reconciler writes Kubernetes objects and
	// starts nothing, reads no store, and is wired by stoke controller,
	// never the reverse.
	"stoke.dev/stoke/internal/pki":        {"stoke.dev/stoke/internal/store", "stoke.dev/stoke/internal/runtime", "stoke.dev/stoke/internal/pool", "stoke.dev/stoke/internal/proc", "stoke.dev/stoke/internal/standalone", "stoke.dev/stoke/internal/controller"},
	"stoke.dev/stoke/internal/runtimeset": {"stoke.dev/stoke/internal/store", "stoke.dev/stoke/internal/runtime/", "stoke.dev/stoke/internal/runtimed", "stoke.dev/stoke/internal/pool", "stoke.dev/stoke/internal/proc", "stoke.dev/stoke/internal/standalone", "stoke.dev/stoke/internal/controller", "os/exec"},

	// The invoke benchmark's floor holds no Stoke code of the invoke
	// path: only the contract's messages and the Runtime Server's gRPC
	// options.
	"stoke.dev/stoke/internal/invokefloor": {"stoke.dev/stoke/internal/runtime/python", "stoke.dev/stoke/internal/runtime/bash", "stoke.dev/stoke/internal/runtimed", "stoke.dev/stoke/internal/gateway", "stoke.dev/stoke/internal/standalone", "stoke.dev/stoke/internal/up", "stoke.dev/stoke/internal/pool"},
}

// testOnly are packages that only tests, their own commands and other
// test-only packages import (and the packages below them).
var testOnly = []string{"stoke.dev/stoke/internal/lambda/lambdasim", "stoke.dev/stoke/internal/invokefloor", "stoke.dev/stoke/internal/testdeps", "stoke.dev/stoke/internal/kubetest", "stoke.dev/stoke/internal/kubepods/kubepodstest", "stoke.dev/stoke/internal/syncbuf", "stoke.dev/stoke/internal/pydeps/pydepstest", "stoke.dev/stoke/internal/artifact/s3test"}

func isTestOnly(pkg string) bool {
	return slices.ContainsFunc(testOnly, func(only string) bool { return pkg == only || strings.HasPrefix(pkg, only+"/") })
}

func TestTestOnlyPackagesStayInTests(t *testing.T) {
	for _, p := range listPackages(t) {
		for _, imp := range p.Imports {
			for _, only := range testOnly {
				if (imp == only || strings.HasPrefix(imp, only+"/")) && !isTestOnly(p.ImportPath) {
					t.Errorf("%s imports the test-only package %s", p.ImportPath, imp)
				}
			}
		}
	}
}

func TestImportsPointOneWay(t *testing.T) {
	for _, p := range listPackages(t) {
		for prefix, bans := range forbidden {
			if !strings.HasPrefix(p.ImportPath, prefix) {
				continue
			}
			for _, imp := range p.Imports {
				for _, ban := range bans {
					if strings.HasPrefix(imp, ban) && !strings.HasPrefix(imp, prefix) {
						t.Errorf("%s imports %s", p.ImportPath, imp)
					}
				}
			}
		}
		// The core runtime package must not know its adapters.
		if p.ImportPath == "stoke.dev/stoke/internal/runtime" {
			for _, imp := range p.Imports {
				if strings.HasPrefix(imp, "stoke.dev/stoke/internal/runtime/") {
					t.Errorf("internal/runtime imports its adapter %s", imp)
				}
			}
		}
	}
}

// TestNoGlobalLogger holds internal/ to the one logger rule (package
// logging): loggers are passed in, so nothing below cmd/ reads or sets
// slog's global default, or logs through it with the package-level
// functions.
func TestNoGlobalLogger(t *testing.T) {
	global := regexp.MustCompile(`\bslog\.(Default|SetDefault|Debug|Info|Warn|Error|Log|DebugContext|InfoContext|WarnContext|ErrorContext|LogAttrs)\(`)
	for _, p := range listPackages(t) {
		if !strings.HasPrefix(p.ImportPath, "stoke.dev/stoke/internal/") {
			continue
		}
		for _, f := range p.GoFiles {
			src, err := os.ReadFile(filepath.Join(p.Dir, f))
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range global.FindAll(src, -1) {
				t.Errorf("%s/%s uses the global logger: %s", p.ImportPath, f, m)
			}
		}
	}
}

// TestNoFatalOffTheTestGoroutine checks every go statement of every test
// (and test helper package): t.Fatal, FailNow and Skip end only the
// goroutine that calls them, so called elsewhere they leave the test
// running without its assertion. A goroutine may call t.Error, or hand
// its error back; it may not call the Fatal family itself or pass the
// test's t, b or tb to a helper, which may.
func TestNoFatalOffTheTestGoroutine(t *testing.T) {
	fset := token.NewFileSet()
	for _, p := range listPackages(t) {
		for _, name := range slices.Concat(p.GoFiles, p.TestGoFiles, p.XTestGoFiles) {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(f, func(n ast.Node) bool {
				g, ok := n.(*ast.GoStmt)
				if !ok {
					return true
				}
				ast.Inspect(g.Call, func(n ast.Node) bool {
					call, ok := n.(*ast.CallExpr)
					if !ok {
						return true
					}
					if sel, ok := call.Fun.(*ast.SelectorExpr); ok {
						switch sel.Sel.Name {
						case "Fatal", "Fatalf", "FailNow", "Skip", "Skipf", "SkipNow":
							t.Errorf("%s: a goroutine calls %s", fset.Position(call.Pos()), sel.Sel.Name)
						}
					}
					for _, a := range call.Args {
						if id, ok := a.(*ast.Ident); ok && (id.Name == "t" || id.Name == "b" || id.Name == "tb") {
							t.Errorf("%s: a goroutine passes %s to a helper", fset.Position(a.Pos()), id.Name)
						}
					}
					return true
				})
				return false
			})
		}
	}
}
