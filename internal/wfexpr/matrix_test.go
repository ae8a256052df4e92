package wfexpr

import (
	"fmt"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"stoke.dev/stoke/api/stoke/v1alpha1"
)

func js(texts ...string) []apiextensionsv1.JSON {
	out := make([]apiextensionsv1.JSON, len(texts))
	for i, t := range texts {
		out[i] = apiextensionsv1.JSON{Raw: []byte(t)}
	}
	return out
}

func axis(name string, values ...string) v1alpha1.MatrixAxis {
	return v1alpha1.MatrixAxis{Name: name, Values: js(values...)}
}

// names lists the instances as "id (v1, v2) {json}" so that a case shows
// both the name GitHub gives and every value.
func names(combos []Combination) []string {
	out := make([]string, len(combos))
	for i, c := range combos {
		out[i] = c.Name("job") + " " + ToJSON(c.Values, false)
	}
	return out
}

// The cases are GitHub's documented examples ("Using a matrix for your
// jobs"), with the combinations the documentation lists, in its order.
func TestExpandMatrix(t *testing.T) {
	for _, tt := range []struct {
		name string
		m    *v1alpha1.Matrix
		want []string
	}{
		{"no matrix", nil, []string{"job {}"}},
		{"one axis", &v1alpha1.Matrix{Axes: []v1alpha1.MatrixAxis{axis("version", "10", "12", "14")}}, []string{
			`job (10) {"version":10}`, `job (12) {"version":12}`, `job (14) {"version":14}`,
		}},
		{"two axes, the first varying slowest", &v1alpha1.Matrix{Axes: []v1alpha1.MatrixAxis{axis("os", `"ubuntu-22.04"`, `"ubuntu-20.04"`), axis("version", "10", "12", "14")}}, []string{
			`job (ubuntu-22.04, 10) {"os":"ubuntu-22.04","version":10}`,
			`job (ubuntu-22.04, 12) {"os":"ubuntu-22.04","version":12}`,
			`job (ubuntu-22.04, 14) {"os":"ubuntu-22.04","version":14}`,
			`job (ubuntu-20.04, 10) {"os":"ubuntu-20.04","version":10}`,
			`job (ubuntu-20.04, 12) {"os":"ubuntu-20.04","version":12}`,
			`job (ubuntu-20.04, 14) {"os":"ubuntu-20.04","version":14}`,
		}},
		// An object's keys are sorted (the API server sorts them).
		{"object values", &v1alpha1.Matrix{Axes: []v1alpha1.MatrixAxis{axis("os", `"ubuntu-latest"`, `"macos-latest"`), axis("node", `{"version":14}`, `{"version":20,"env":"NODE_OPTIONS=--openssl-legacy-provider"}`)}}, []string{
			`job (ubuntu-latest, {"version":14}) {"os":"ubuntu-latest","node":{"version":14}}`,
			`job (ubuntu-latest, {"env":"NODE_OPTIONS=--openssl-legacy-provider","version":20}) {"os":"ubuntu-latest","node":{"env":"NODE_OPTIONS=--openssl-legacy-provider","version":20}}`,
			`job (macos-latest, {"version":14}) {"os":"macos-latest","node":{"version":14}}`,
			`job (macos-latest, {"env":"NODE_OPTIONS=--openssl-legacy-provider","version":20}) {"os":"macos-latest","node":{"env":"NODE_OPTIONS=--openssl-legacy-provider","version":20}}`,
		}},
		// "Expanding or adding matrix configurations": include merges
		// where it changes no original value, may overwrite what an
		// earlier include added, and otherwise adds a combination that
		// later entries do not extend.
		{"include: the fruit example", &v1alpha1.Matrix{
			Axes: []v1alpha1.MatrixAxis{axis("fruit", `"apple"`, `"pear"`), axis("animal", `"cat"`, `"dog"`)},
			Include: js(`{"color":"green"}`, `{"color":"pink","animal":"cat"}`, `{"fruit":"apple","shape":"circle"}`,
				`{"fruit":"banana"}`, `{"fruit":"banana","animal":"cat"}`),
		}, []string{
			`job (apple, cat, pink, circle) {"fruit":"apple","animal":"cat","color":"pink","shape":"circle"}`,
			`job (apple, dog, green, circle) {"fruit":"apple","animal":"dog","color":"green","shape":"circle"}`,
			`job (pear, cat, pink) {"fruit":"pear","animal":"cat","color":"pink"}`,
			`job (pear, dog, green) {"fruit":"pear","animal":"dog","color":"green"}`,
			`job (banana) {"fruit":"banana"}`,
			`job (banana, cat) {"fruit":"banana","animal":"cat"}`,
		}},
		{"include: extra value for one combination", &v1alpha1.Matrix{
			Axes:    []v1alpha1.MatrixAxis{axis("os", `"windows-latest"`, `"ubuntu-latest"`), axis("node", "14", "16")},
			Include: js(`{"os":"windows-latest","node":16,"npm":6}`),
		}, []string{
			`job (windows-latest, 14) {"os":"windows-latest","node":14}`,
			`job (windows-latest, 16, 6) {"os":"windows-latest","node":16,"npm":6}`,
			`job (ubuntu-latest, 14) {"os":"ubuntu-latest","node":14}`,
			`job (ubuntu-latest, 16) {"os":"ubuntu-latest","node":16}`,
		}},
		// Keys no axis names come in alphabetical order (GitHub keeps
		// include's; the API server does not).
		{"include only", &v1alpha1.Matrix{Include: js(`{"site":"production","datacenter":"site-a"}`, `{"site":"staging","datacenter":"site-b"}`)}, []string{
			`job (site-a, production) {"datacenter":"site-a","site":"production"}`,
			`job (site-b, staging) {"datacenter":"site-b","site":"staging"}`,
		}},
		// "Excluding matrix configurations": a partial match excludes.
		{"exclude", &v1alpha1.Matrix{
			Axes:    []v1alpha1.MatrixAxis{axis("os", `"macos-latest"`, `"windows-latest"`), axis("version", "12", "14", "16"), axis("environment", `"staging"`, `"production"`)},
			Exclude: js(`{"os":"macos-latest","version":12,"environment":"production"}`, `{"os":"windows-latest","version":16}`),
		}, []string{
			`job (macos-latest, 12, staging) {"os":"macos-latest","version":12,"environment":"staging"}`,
			`job (macos-latest, 14, staging) {"os":"macos-latest","version":14,"environment":"staging"}`,
			`job (macos-latest, 14, production) {"os":"macos-latest","version":14,"environment":"production"}`,
			`job (macos-latest, 16, staging) {"os":"macos-latest","version":16,"environment":"staging"}`,
			`job (macos-latest, 16, production) {"os":"macos-latest","version":16,"environment":"production"}`,
			`job (windows-latest, 12, staging) {"os":"windows-latest","version":12,"environment":"staging"}`,
			`job (windows-latest, 12, production) {"os":"windows-latest","version":12,"environment":"production"}`,
			`job (windows-latest, 14, staging) {"os":"windows-latest","version":14,"environment":"staging"}`,
			`job (windows-latest, 14, production) {"os":"windows-latest","version":14,"environment":"production"}`,
		}},
		{"exclude everything, include adds", &v1alpha1.Matrix{
			Axes: []v1alpha1.MatrixAxis{axis("a", "1")}, Exclude: js(`{"a":1}`), Include: js(`{"a":2}`),
		}, []string{`job (2) {"a":2}`}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			combos, err := ExpandMatrix(tt.m)
			if err != nil {
				t.Fatal(err)
			}
			got := names(combos)
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
			for _, c := range combos {
				back, err := MatrixFromStatus(c.Status())
				if err != nil {
					t.Fatal(err)
				}
				for _, k := range c.Keys {
					a, _ := c.Values.Get(k)
					b, _ := back.Get(k)
					if ToJSON(a, false) != ToJSON(b, false) {
						t.Fatalf("%s: status round trip %s → %s", k, ToJSON(a, false), ToJSON(b, false))
					}
				}
			}
		})
	}
}

func TestExpandMatrixRefuses(t *testing.T) {
	many := make([]string, 17)
	for i := range many {
		many[i] = fmt.Sprint(i)
	}
	long := `"` + strings.Repeat("x", 300) + `"`
	for _, tt := range []struct {
		name string
		m    *v1alpha1.Matrix
		want string
	}{
		{"over the bound", &v1alpha1.Matrix{Axes: []v1alpha1.MatrixAxis{axis("a", many...), axis("b", many...)}}, "over the bound of 256 combinations"},
		{"includes over the bound", &v1alpha1.Matrix{Axes: []v1alpha1.MatrixAxis{axis("a", many[:16]...), axis("b", many[:16]...)}, Include: js(`{"a":99}`)}, "include: the matrix is over the bound of 256"},
		{"everything excluded", &v1alpha1.Matrix{Axes: []v1alpha1.MatrixAxis{axis("a", "1", "2")}, Exclude: js(`{"a":1}`, `{"a":2}`)}, "every combination of the matrix is excluded"},
		{"exclude names no axis", &v1alpha1.Matrix{Axes: []v1alpha1.MatrixAxis{axis("a", "1")}, Exclude: js(`{"b":1}`)}, `exclude[0]: key "b" is no axis`},
		{"include not an object", &v1alpha1.Matrix{Include: js(`[1]`)}, "include[0]: must be an object"},
		{"empty include", &v1alpha1.Matrix{Include: js(`{}`)}, "include[0]: must be an object with at least one key"},
		{"axis without values", &v1alpha1.Matrix{Axes: []v1alpha1.MatrixAxis{{Name: "a"}}}, "axes[0] (a): has no values"},
		{"bad JSON", &v1alpha1.Matrix{Axes: []v1alpha1.MatrixAxis{axis("a", `{`)}}, "axes[0].values[0]: invalid JSON"},
		{"values over their bound", &v1alpha1.Matrix{Axes: []v1alpha1.MatrixAxis{axis("a", long)}}, "over the bound of 256"},
		{"exclude without axes", &v1alpha1.Matrix{Exclude: js(`{"a":1}`)}, "no axes to exclude from"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ExpandMatrix(tt.m)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want %q", err, tt.want)
			}
		})
	}
}
