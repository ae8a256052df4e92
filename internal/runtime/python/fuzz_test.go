package python

import (
	"strings"
	"testing"
)

// FuzzValidateHandler checks that whatever ValidateHandler accepts is
// dotted Python identifiers, at least a module and a function, within the
// handler bound.
func FuzzValidateHandler(f *testing.F) {
	for _, seed := range []string{"handler.handle", "pkg.sub.mod.fn", "a", ".a", "a.", "a..b", "1a.b", "a.b-c", "import.x", "ünï.cødé", "a.b\x00"} {
		f.Add(seed)
	}
	a := New(Config{Interpreter: "python3"})
	f.Fuzz(func(t *testing.T, h string) {
		if a.ValidateHandler(h) != nil {
			return
		}
		parts := strings.Split(h, ".")
		if len(parts) < 2 {
			t.Fatalf("accepted %q without a module", h)
		}
		for _, p := range parts {
			if p == "" {
				t.Fatalf("accepted %q with an empty part", h)
			}
			for i, c := range p {
				ok := c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (i > 0 && c >= '0' && c <= '9')
				if !ok {
					t.Fatalf("accepted %q: %q is not an identifier", h, p)
				}
			}
		}
	})
}
