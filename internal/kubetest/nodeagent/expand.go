package nodeagent

import "strings"

// expand replaces $(VAR) in s with VAR's value from vars, as the kubelet
// does for command, args and env values
// (third_party/forked/golang/expansion): $$ is an escaped $, and a
// reference to an undefined variable, or one that is not closed, is left
// as written.
func expand(s string, vars func(string) (string, bool)) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch next := s[i+1]; {
		case next == '$':
			b.WriteByte('$')
			i++
		case next == '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := vars(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}
