package server

import (
	"maps"
	"testing"
)

func TestHandlerEnvFrom(t *testing.T) {
	environ := []string{"PATH=/opt/venv/bin:/usr/bin", "HOME=/root", "TMPDIR=/tmp", "PYTHONPATH=/opt/lib", "SECRET=s", "A-B=x", "GREETING=hi"}
	for _, tt := range []struct {
		name  string
		names []string
		want  map[string]string
	}{
		{"none", nil, nil},
		{"named", []string{"PYTHONPATH", "GREETING", "ABSENT"}, map[string]string{"PYTHONPATH": "/opt/lib", "GREETING": "hi"}},
		{"HOME and TMPDIR are the Run's", []string{"HOME", "TMPDIR", "GREETING"}, map[string]string{"GREETING": "hi"}},
		{"all", []string{HandlerEnvAll}, map[string]string{"PATH": "/opt/venv/bin:/usr/bin", "PYTHONPATH": "/opt/lib", "SECRET": "s", "GREETING": "hi"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := HandlerEnvFrom(tt.names, environ)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
	if _, err := HandlerEnvFrom([]string{"A-B"}, environ); err == nil {
		t.Fatal("a name no handler env can carry was taken")
	}
	if _, err := HandlerEnvFrom([]string{"*", "PATH"}, environ); err == nil {
		t.Fatal("'*' beside a name was taken")
	}
}
