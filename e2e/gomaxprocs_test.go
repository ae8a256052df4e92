package e2e

import (
	"encoding/json"
	"os"
	"runtime"
	"strings"
	"testing"

	"stoke.dev/stoke/internal/testbin"
)

// stoke up runs its Go code on half the CPUs Go would give it (at least
// one), unless GOMAXPROCS in its environment says otherwise; its
// "serving" log line says the value in effect.
func TestUpGOMAXPROCS(t *testing.T) {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOMAXPROCS=") {
			env = append(env, kv)
		}
	}
	goDefault := runtime.NumCPU() // Go's default here: no CPU limit on the tests' cgroup
	if _, set := os.LookupEnv("GOMAXPROCS"); !set {
		goDefault = runtime.GOMAXPROCS(0)
	}
	for _, c := range []struct {
		env []string
		up  int
	}{
		{env, max(1, goDefault/2)},
		{append(env[:len(env):len(env)], "GOMAXPROCS=3"), 3},
	} {
		dir := t.TempDir()
		u, err := testbin.StartUpAs(nil, c.env, stokeBin, dir)
		if err != nil {
			t.Fatal(err)
		}
		up := -1
		for _, line := range u.Log() {
			var rec struct {
				Msg        string
				GOMAXPROCS *int `json:"gomaxprocs"`
			}
			if json.Unmarshal([]byte(line), &rec) != nil || rec.GOMAXPROCS == nil {
				continue
			}
			if rec.Msg == "serving" {
				up = *rec.GOMAXPROCS
			}
		}
		if err := u.Close(); err != nil {
			t.Error(err)
		}
		if up != c.up {
			t.Errorf("environment ending %q: stoke up's gomaxprocs %d, want %d", c.env[len(c.env)-1], up, c.up)
		}
	}
}
