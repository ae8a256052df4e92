package httpapi_test

import (
	"testing"

	"stoke.dev/stoke/internal/httpapi"
)

func TestBearerToken(t *testing.T) {
	for _, tt := range []struct {
		header, token string
		ok            bool
	}{
		{"Bearer abc", "abc", true},
		{"bearer abc", "abc", true},
		{"BEARER abc", "abc", true},
		{"bEaReR abc", "abc", true},
		{"Bearer   abc", "abc", true},
		{"", "", false},
		{"Bearer", "", false},
		{"Bearer ", "", false},
		{"Bearerabc", "", false},
		{"Basic abc", "", false},
		{" Bearer abc", "", false},
	} {
		token, ok := httpapi.BearerToken(tt.header)
		if token != tt.token || ok != tt.ok {
			t.Errorf("BearerToken(%q) = %q, %v; want %q, %v", tt.header, token, ok, tt.token, tt.ok)
		}
	}
}
