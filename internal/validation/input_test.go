package validation

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"stoke.dev/stoke/internal/errdefs"
)

// aliasDoc is a Run document whose label value, of size bytes, is aliased
// n times as annotations.
func aliasDoc(size, n int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: stoke.dev/v1alpha1\nkind: Run\nmetadata:\n  name: amp\n  labels:\n    a: &big %q\n  annotations:\n", strings.Repeat("x", size))
	for i := range n {
		fmt.Fprintf(&b, "    k%d: *big\n", i)
	}
	b.WriteString("spec:\n  runtime: bash\n  mode:\n    task:\n      args: [\"true\"]\n")
	return []byte(b.String())
}

func TestYAMLExpansion(t *testing.T) {
	nested := "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
	for i, prev := 0, "a"; i < 9; i++ {
		name := fmt.Sprint("l", i)
		nested += fmt.Sprintf("%s: &%s [*%s, *%s, *%s, *%s, *%s, *%s, *%s, *%s, *%s, *%s]\n", name, name, prev, prev, prev, prev, prev, prev, prev, prev, prev, prev)
		prev = name
	}
	for _, tt := range []struct {
		name    string
		doc     string
		refused bool
	}{
		{"the issue's alias Run", string(aliasDoc(3900<<10, 99)), true},
		{"a billion laughs", nested, true},
		{"aliases within the bound", string(aliasDoc(1<<10, 99)), false},
		{"a cycle", "a: &a [*a]\n", true},
		{"a star and an ampersand, no alias", "args: ['*.go', 'a && b']\n", false},
		{"a large value, no alias", string(aliasDoc(3900<<10, 0)), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := YAMLExpansion("body", []byte(tt.doc))
			if refused := err != nil; refused != tt.refused {
				t.Fatalf("refused %v, want %v: %v", refused, tt.refused, err)
			}
			if err == nil {
				if _, err := yaml.YAMLToJSON([]byte(tt.doc)); err != nil && tt.name != "a cycle" {
					t.Errorf("taken, but the decoder fails: %v", err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.HasPrefix(err.Error(), "body: ") || len(err.Error()) > 300 {
				t.Errorf("error %q, want a short InvalidArgument naming body", err)
			}
		})
	}
}

func TestUTF8(t *testing.T) {
	if err := UTF8("body", []byte(`{"a":"café ✓"}`)); err != nil {
		t.Errorf("UTF-8 refused: %v", err)
	}
	err := UTF8("body", []byte("{\"a\":\"caf\xe9\"}"))
	if !errors.Is(err, errdefs.ErrInvalidArgument) || err.Error() != "body: is not UTF-8 text: byte 9 is 0xe9" {
		t.Errorf("got %v", err)
	}
}
