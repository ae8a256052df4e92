package python

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"stoke.dev/stoke/internal/pydeps"
	"stoke.dev/stoke/internal/pydeps/pydepstest"
	"stoke.dev/stoke/internal/runtime"
)

// probe imports the modules its event names and answers where each came
// from, beside what else a registration's requirements could change.
const probe = `import importlib, os, sys
print("imported probe", flush=True)
def handle(event, context):
    mods = {}
    for name in event or []:
        m = importlib.import_module(name)
        mods[name] = [getattr(m, "MARK", None), getattr(m, "__file__", None)]
    sc = sys.modules.get("sitecustomize")
    return {"pid": os.getpid(), "cwd": os.getcwd(), "path": sys.path,
            "env": dict(os.environ), "mods": mods,
            "sitecustomize": getattr(sc, "__file__", None),
            "pth": hasattr(sys, "stoke_pth"), "flags": repr(sys.flags)}
`

type probed struct {
	Pid           int                   `json:"pid"`
	Cwd           string                `json:"cwd"`
	Path          []string              `json:"path"`
	Env           map[string]string     `json:"env"`
	Mods          map[string][2]*string `json:"mods"`
	SiteCustomize *string               `json:"sitecustomize"`
	Pth           bool                  `json:"pth"`
	Flags         string                `json:"flags"`
}

// mark is the MARK of module name in p ("" if it has none).
func (p probed) mark(name string) string {
	if m := p.Mods[name][0]; m != nil {
		return *m
	}
	return ""
}

// depsWheels are the wheels the requirements tests install, each marking
// its modules MARK = 'deps'.
var depsWheels = map[string]map[string]string{
	"tinydep": {"tinydep/__init__.py": "MARK = 'deps'\n"},
	// A standard-library module that no worker imports at its start.
	"colorsys": {"colorsys/__init__.py": "MARK = 'deps'\n"},
	// One the worker imports at its start (worker.py: from struct import
	// Struct), working as the standard library's does.
	"struct":  {"struct/__init__.py": "from _struct import *\nfrom _struct import _clearcache\nMARK = 'deps'\n"},
	"stokesc": {"sitecustomize.py": "MARK = 'deps'\n"},
	"withpth": {"withpth/__init__.py": "MARK = 'deps'\n", "withpth.pth": "import sys; sys.stoke_pth = True\n"},
}

// depsAdapters returns an adapter keeping a spare and one that does not,
// sharing a requirements cache that installs from depsWheels; the spare's
// made channel; and the cache.
func depsAdapters(tb testing.TB) (spared *Adapter, made <-chan int, own *Adapter, cache *pydeps.Cache) {
	tb.Helper()
	links := tb.TempDir()
	for name, files := range depsWheels {
		if _, err := pydepstest.WheelFiles(links, name, "1.0", files); err != nil {
			tb.Fatal(err)
		}
	}
	cache, err := pydeps.New(pydeps.Config{Root: tb.TempDir(), Python: testInterpreter(tb), FindLinks: links})
	if err != nil {
		tb.Fatal(err)
	}
	spared = New(Config{Interpreter: testInterpreter(tb), Deps: cache, Spare: true})
	mc := make(chan int, 16)
	spared.spares.made = func(pid int) { mc <- pid }
	spared.KeepSpare(runtime.SpareSpec{Env: spareEnv(nil)})
	tb.Cleanup(spared.CloseSpare)
	return spared, mc, New(Config{Interpreter: testInterpreter(tb), Deps: cache}), cache
}

// probeCall loads spec on a, checks that what the import printed is filed
// under the registration, and calls the probe with modules.
func probeCall(tb testing.TB, a *Adapter, spec runtime.FunctionSpec, rec *recorder, modules ...string) probed {
	tb.Helper()
	printed := rec.await("imported probe")
	inst := loadSpec(tb, a, spec)
	select {
	case <-printed:
	case <-time.After(30 * time.Second):
		tb.Fatal("what the handler's import printed was not logged under its registration")
	}
	in, _ := json.Marshal(modules)
	res, err := invoke(tb, inst, rec, "inv", string(in))
	if err != nil {
		tb.Fatal(err)
	}
	var p probed
	if err := json.Unmarshal(res.Output, &p); err != nil {
		tb.Fatalf("%s: %v", res.Output, err)
	}
	return p
}

// A registration with requirements takes the spare, which puts their
// directory on sys.path where PYTHONPATH puts it on a worker's own
// interpreter, unless the directory holds a module the spare has imported
// (which PYTHONPATH would have taken from the requirements at start) or a
// sitecustomize (which `site` would have run): then it gets a worker of its
// own, as before, and the spare stays for the next registration. Each
// registration sees what it sees on a worker of its own (the adapter
// without a spare): the same modules from the same files, sys.path,
// environment, working directory; and the import's output is logged under
// it.
func TestSpareTakesRequirementsAsPythonpathWould(t *testing.T) {
	spared, made, own, cache := depsAdapters(t)
	spare := nextSpare(t, made)
	for _, c := range []struct {
		name, requirement string
		modules           []string
		handed            bool // through the spare
	}{
		{"the requirements' own package", "tinydep", []string{"tinydep"}, true},
		// Not imported before: found in the requirements first, as on
		// PYTHONPATH, which comes before the standard library.
		{"a standard-library module not yet imported", "colorsys", []string{"colorsys"}, true},
		// The spare has the standard library's; PYTHONPATH would have
		// given the worker the requirements' at its start.
		{"a module the worker imported at its start", "struct", []string{"struct"}, false},
		// `site` imports sitecustomize from PYTHONPATH at start.
		{"a sitecustomize", "stokesc", nil, false},
		// .pth files are read in site directories only, never on
		// PYTHONPATH: by neither.
		{"a .pth file", "withpth", []string{"withpth"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := writeHandlers(t, map[string]string{"probe.py": probe, "requirements.txt": c.requirement + "==1.0\n"})
			// Installed first, outside Load's bound: pip's start on a
			// loaded machine.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			root, err := cache.Dir(ctx, dir)
			if err != nil {
				t.Fatal(err)
			}
			root = filepath.Dir(root)
			rec, freshRec := newRecorder(), newRecorder()
			spec := testSpec(t, dir, "probe.handle", rec, map[string]string{"GREETING": "hello"})
			freshSpec := spec
			freshSpec.Logger, freshSpec.Output = slog.New(freshRec.handler()), freshRec
			got := probeCall(t, spared, spec, rec, c.modules...)
			fresh := probeCall(t, own, freshSpec, freshRec, c.modules...)

			if handed := got.Pid == spare; handed != c.handed {
				t.Fatalf("through the spare: %v, want %v", handed, c.handed)
			}
			if fresh.Pid == spare || fresh.Pid == got.Pid {
				t.Fatalf("the worker of its own is pid %d", fresh.Pid)
			}
			deps := got.Env["PYTHONPATH"]
			if !strings.HasPrefix(deps, root+string(filepath.Separator)) || !slices.Contains(got.Path, deps) {
				t.Fatalf("PYTHONPATH %q, sys.path %q: want the requirements under %s on both", deps, got.Path, root)
			}
			for _, m := range c.modules {
				if got.mark(m) != "deps" || !strings.HasPrefix(*got.Mods[m][1], deps) {
					t.Errorf("%s is %v, want the requirements' (in %s)", m, got.Mods[m], deps)
				}
			}
			switch c.requirement {
			case "stokesc":
				if got.SiteCustomize == nil || !strings.HasPrefix(*got.SiteCustomize, deps) {
					t.Errorf("sitecustomize %v, want the requirements'", got.SiteCustomize)
				}
			case "withpth":
				if _, err := os.Stat(filepath.Join(deps, "withpth.pth")); err != nil {
					t.Fatalf("the .pth file is not in the requirements: %v", err)
				}
			}
			got.Pid, fresh.Pid = 0, 0
			if !maps.Equal(got.Env, fresh.Env) {
				t.Errorf("environment through the spare:\n%v\non a worker of its own:\n%v", got.Env, fresh.Env)
			}
			if !reflect.DeepEqual(got, fresh) {
				t.Errorf("through the spare:\n%+v\non a worker of its own:\n%+v", got, fresh)
			}

			if c.handed {
				spare = nextSpare(t, made)
				return
			}
			// Refused, the spare waited on: the next registration without
			// requirements takes it.
			plain := writeHandlers(t, map[string]string{"probe.py": probe})
			rec = newRecorder()
			if p := probeCall(t, spared, testSpec(t, plain, "probe.handle", rec, nil), rec); p.Pid != spare {
				t.Fatalf("the registration after the refusal ran in pid %d, not in the spare %d", p.Pid, spare)
			}
			spare = nextSpare(t, made)
		})
	}
}
