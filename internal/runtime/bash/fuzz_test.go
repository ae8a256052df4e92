package bash

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/runtime"
	"stoke.dev/stoke/internal/validation"
)

// FuzzPayload checks the one promise the payload path makes: the handler
// receives the payload as exactly one argument, byte for byte, and no part
// of it is ever run. Payloads are strings embedded in JSON with only the
// escapes JSON requires, so shell syntax, quotes, globs and non-UTF-8
// bytes reach bash as they are. An injected command would create the file
// "canary" in the working directory.
func FuzzPayload(f *testing.F) {
	for _, s := range []string{
		"", "plain", "$(touch canary)", "`touch canary`", "'; touch canary; '", "\"; touch canary; \"",
		"$(touch canary)\n`touch canary`", "${IFS}touch${IFS}canary", "* ? [a-z] ~ {a,b}", "\\", "\\\\n",
		"\x00", "\n\n\n", "ü ß 漢字 🙂", "\xff\xfe invalid utf-8", "-e", "--", "-n", "%s %d %n",
		"$((1/0))", "!!", "$0 $1 $@ $*", "a\x1e0123456789abcdef start 1", "\x1b[31mred",
		strings.Repeat("$(touch canary)", 5000), strings.Repeat("x", 100<<10),
	} {
		f.Add(s)
	}
	fx := newFixtureTB(f, map[string]string{"h.sh": `show() { printf '%s:%s' "$#" "$1"; }` + "\n"})
	in := fx.mustLoad("h.show")
	canary := filepath.Join(fx.dir, "canary")
	f.Fuzz(func(t *testing.T, s string) {
		input := jsonString(s)
		if len(input) > bounds.InvokeBody {
			t.Skip("payload larger than an invocation may be")
		}
		if !json.Valid(input) {
			t.Fatalf("test bug: %q is not valid JSON", input)
		}
		ctx, cancel := context.WithTimeout(context.Background(), invokeTimeout)
		defer cancel()
		res, err := in.Invoke(ctx, runtime.Invocation{ID: "fuzz", RunUID: "uid-1", Input: input})
		if err != nil {
			t.Fatalf("Invoke: %v", err)
		}
		if want := "1:" + string(input); string(res.Output) != want {
			t.Fatalf("handler got %.300q, want %.300q", res.Output, want)
		}
		if _, err := os.Stat(canary); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the payload ran a command (canary: %v)", err)
		}
	})
}

// jsonString quotes s as a JSON string, escaping only what JSON requires
// and leaving every other byte (including invalid UTF-8) as it is.
func jsonString(s string) []byte {
	b := []byte{'"'}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, `\u00`...)
			b = append(b, "0123456789abcdef"[c>>4], "0123456789abcdef"[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// FuzzValidateHandler checks that an accepted handler always names a
// function bash can call and a .sh file that stays in the working
// directory, and that the handler can be rebuilt from the two.
func FuzzValidateHandler(f *testing.F) {
	for _, h := range []string{
		"handler.handle", "lib/fns.echo", "lib.v2/fns.echo", "../x.y", "/abs.f", "a/../b.c", "...fn", "..fn",
		".x", "x.", "a/./b.c", "a//b.c", "a/.b", "a/b/.c", "x.$(id)", "x.a;b", "x\x00.y", "x.\u00e9",
	} {
		f.Add(h)
	}
	fnRE := regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	wd := "/workspace/runs/r"
	a := New(Config{BashPath: "/bin/bash"})
	f.Fuzz(func(t *testing.T, h string) {
		file, fn, err := parseHandler(h)
		if verr := a.ValidateHandler(h); (verr == nil) != (err == nil) {
			t.Fatalf("ValidateHandler and parseHandler disagree: %v, %v", verr, err)
		}
		if err != nil {
			return
		}
		if !fnRE.MatchString(fn) {
			t.Fatalf("accepted function name %q", fn)
		}
		base, ok := strings.CutSuffix(file, ".sh")
		if !ok || base+"."+fn != h {
			t.Fatalf("%q parsed as %q, %q", h, file, fn)
		}
		if err := validation.RelativePath("handler", file); err != nil {
			t.Fatalf("accepted file %q: %v", file, err)
		}
		if !filepath.IsLocal(file) || !runtime.Within(wd, filepath.Join(wd, file)) || filepath.Join(wd, file) == wd {
			t.Fatalf("accepted file %q leaves the working directory", file)
		}
	})
}
