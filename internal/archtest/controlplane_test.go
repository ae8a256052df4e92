package archtest

import (
	"slices"
	"strings"
	"testing"
)

// The control-plane core is the same code in standalone (`stoke up`) and in
// Kubernetes (`stoke controller`, `stoke runtimed`): only the store and the
// source of pods differ, and those come in through interfaces
// (store.Store, podsource.Source).
var controlPlaneCore = []string{
	"stoke.dev/stoke/internal/scheduler",
	"stoke.dev/stoke/internal/reaper",
	"stoke.dev/stoke/internal/retry",
	"stoke.dev/stoke/internal/runtimed",
	"stoke.dev/stoke/internal/podsource",
	"stoke.dev/stoke/internal/controlplane",
	"stoke.dev/stoke/internal/loop",
	"stoke.dev/stoke/internal/functionset",
	"stoke.dev/stoke/internal/autoscaler",
	"stoke.dev/stoke/internal/workflow",
}

// coreBansAnywhere are what the core may not reach even indirectly: a
// store implementation, a pod source (local processes, Kubernetes Pods),
// Kubernetes clients.
var coreBansAnywhere = []string{
	"stoke.dev/stoke/internal/store/sqlite",
	"stoke.dev/stoke/internal/store/kube",
	"modernc.org/sqlite",
	"stoke.dev/stoke/internal/pool",
	"stoke.dev/stoke/internal/kubepods",
	"k8s.io/client-go",
	"sigs.k8s.io/controller-runtime",
}

// coreBansDirect are what the core may not import itself: local processes.
// (runtimed reaches them only through the workspace helpers of
// internal/runtime and the exec core, which it shares with the Runtime
// Server; it starts nothing itself.)
var coreBansDirect = []string{
	"stoke.dev/stoke/internal/proc",
	"os/exec",
}

func TestControlPlaneCoreKnowsNoStoreProcessesOrKubernetes(t *testing.T) {
	seen := 0
	for _, p := range listPackages(t) {
		if !slices.Contains(controlPlaneCore, p.ImportPath) {
			continue
		}
		seen++
		for _, dep := range p.Deps {
			for _, ban := range coreBansAnywhere {
				if dep == ban || strings.HasPrefix(dep, ban+"/") {
					t.Errorf("%s depends on %s", p.ImportPath, dep)
				}
			}
		}
		for _, imp := range p.Imports {
			for _, ban := range coreBansDirect {
				if imp == ban || strings.HasPrefix(imp, ban+"/") {
					t.Errorf("%s imports %s", p.ImportPath, imp)
				}
			}
		}
	}
	if seen != len(controlPlaneCore) {
		t.Fatalf("found %d of the %d core packages", seen, len(controlPlaneCore))
	}
}
