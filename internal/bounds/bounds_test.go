package bounds

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTruncate(t *testing.T) {
	if got := Truncate("short", 10); got != "short" {
		t.Fatalf("got %q", got)
	}
	long := strings.Repeat("é", 100) // two bytes each
	for max := 0; max < 60; max++ {
		got := Truncate(long, max)
		if len(got) > max || !utf8.ValidString(got) || (max >= 14 && !strings.HasSuffix(got, "…[truncated]")) {
			t.Fatalf("Truncate(_, %d) = %q (%d bytes)", max, got, len(got))
		}
		got = TruncateHead(long, max)
		if len(got) > max || !utf8.ValidString(got) || (max >= 14 && !strings.HasPrefix(got, "[truncated]…")) {
			t.Fatalf("TruncateHead(_, %d) = %q (%d bytes)", max, got, len(got))
		}
	}
}
