package hashfiles

import (
	"fmt"
	"path"
	"strings"

	"stoke.dev/stoke/internal/bounds"
)

// matchKind is what a pattern matches: @actions/glob's MatchKind. A
// pattern with a trailing '/' matches directories only.
type matchKind int

const (
	matchNone matchKind = 0
	matchDir  matchKind = 1
	matchFile matchKind = 2
	matchAll            = matchDir | matchFile
)

// segment is one path element of a pattern: a literal name, a glob in
// path.Match's syntax, or the globstar `**`.
type segment struct {
	literal  string
	glob     string
	isGlob   bool
	globstar bool
}

func (s segment) match(name string) bool {
	switch {
	case s.globstar:
		return true
	case s.isGlob:
		ok, err := path.Match(s.glob, name)
		return ok && err == nil
	}
	return s.literal == name
}

// pattern is one line of a hashFiles argument, as @actions/glob's Pattern
// reads it: absolute (a relative one is under the working directory), its
// segments, whether it is negated (`!`) or ends in '/'.
type pattern struct {
	negate  bool
	dirOnly bool
	segs    []segment
}

// searchPath is the literal segments before the first glob: where the
// walk for this pattern starts.
func (p *pattern) searchPath() []string {
	var out []string
	for _, s := range p.segs {
		if s.isGlob || s.globstar {
			break
		}
		out = append(out, s.literal)
	}
	return out
}

// withDescendants is the pattern with `**` appended: @actions/glob's
// implicit descendants (a directory that matches brings all below it).
func (p *pattern) withDescendants() *pattern {
	segs := append(append([]segment(nil), p.segs...), segment{globstar: true})
	return &pattern{negate: p.negate, segs: segs}
}

func (p *pattern) endsInGlobstar() bool {
	return len(p.segs) > 0 && p.segs[len(p.segs)-1].globstar
}

// match is Pattern.match: a pattern ending in `**` also matches the
// directory it starts from (minimatch's trailing-slash quirk, which
// @actions/glob works around on purpose).
func (p *pattern) match(item []string) matchKind {
	if !matchSegs(p.segs, item, false) {
		return matchNone
	}
	if p.dirOnly {
		return matchDir
	}
	return matchAll
}

// partialMatch reports whether something below item may match.
func (p *pattern) partialMatch(item []string) bool {
	return matchSegs(p.segs, item, true)
}

// matchSegs is minimatch's matchOne over path elements: `**` matches
// zero or more elements; partial reports true when item runs out first
// (a directory on the way to a match).
func matchSegs(pat []segment, item []string, partial bool) bool {
	for len(pat) > 0 {
		if pat[0].globstar {
			if len(pat) == 1 {
				return true
			}
			for i := 0; i <= len(item); i++ {
				if matchSegs(pat[1:], item[i:], partial) {
					return true
				}
			}
			return partial
		}
		if len(item) == 0 {
			return partial
		}
		if !pat[0].match(item[0]) {
			return false
		}
		pat, item = pat[1:], item[1:]
	}
	return len(item) == 0
}

// parsePatterns reads one hashFiles call's patterns (its arguments joined
// by newlines, as the runner joins them): one a line, trimmed, blank and
// `#` lines skipped. wd and home are absolute and clean.
func parsePatterns(text, wd, home string) ([]*pattern, error) {
	var out []*pattern
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if len(line) > bounds.HashFilesPattern {
			return nil, fmt.Errorf("pattern %s is %d bytes, at most %d allowed", bounds.Quote(line), len(line), bounds.HashFilesPattern)
		}
		p, err := parsePattern(line, wd, home)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
		if len(out) > bounds.HashFilesPatterns {
			return nil, fmt.Errorf("more than %d patterns", bounds.HashFilesPatterns)
		}
	}
	return out, nil
}

func parsePattern(line, wd, home string) (*pattern, error) {
	p := &pattern{}
	orig := line
	for strings.HasPrefix(line, "!") {
		p.negate = !p.negate
		line = strings.TrimSpace(line[1:])
	}
	if line == "" {
		return nil, fmt.Errorf("pattern %s is empty", bounds.Quote(orig))
	}
	for strings.Contains(line, "//") {
		line = strings.ReplaceAll(line, "//", "/")
	}
	p.dirOnly = len(line) > 1 && strings.HasSuffix(line, "/")
	var base string
	rest := line
	switch {
	case line == "." || strings.HasPrefix(line, "./"):
		base, rest = wd, strings.TrimPrefix(line, ".")
	case line == "~" || strings.HasPrefix(line, "~/"):
		base, rest = home, strings.TrimPrefix(line, "~")
	case strings.HasPrefix(line, "/"):
		base = "/"
	default:
		base = wd
	}
	for _, name := range strings.Split(base, "/") {
		if name != "" {
			p.segs = append(p.segs, segment{literal: name})
		}
	}
	for i, raw := range strings.Split(rest, "/") {
		if raw == "" {
			continue
		}
		s := parseSegment(raw)
		if !s.isGlob && !s.globstar && (s.literal == ".." || s.literal == "." && i > 0) {
			return nil, fmt.Errorf("invalid pattern %s: relative pathing '.' and '..' is not allowed", bounds.Quote(orig))
		}
		p.segs = append(p.segs, s)
	}
	return p, nil
}

// parseSegment reads one element as minimatch does with @actions/glob's
// options (no braces, no extglobs, '\' escapes, dot files matched): a
// literal when it has no unescaped `*`, `?` or `[` set of more than one
// character (@actions/glob's getLiteral), otherwise a path.Match glob.
func parseSegment(raw string) segment {
	if raw == "**" {
		return segment{globstar: true}
	}
	if lit, ok := literal(raw); ok {
		return segment{literal: lit}
	}
	var b strings.Builder
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch c {
		case '\\':
			if i+1 < len(raw) {
				b.WriteByte('\\')
				b.WriteByte(raw[i+1])
				i++
			} else {
				b.WriteString(`\\`)
			}
		case '[':
			end := classEnd(raw, i)
			if end < 0 {
				b.WriteString(`\[`) // minimatch: an unclosed '[' is itself
				continue
			}
			class := raw[i+1 : end]
			if strings.HasPrefix(class, "!") {
				class = "^" + class[1:]
			}
			b.WriteByte('[')
			b.WriteString(class)
			b.WriteByte(']')
			i = end
		default:
			b.WriteByte(c)
		}
	}
	return segment{glob: b.String(), isGlob: true}
}

// classEnd is the index of the ']' closing the set that opens at i, or
// -1; a ']' first in the set (after a '!' or '^') is a member.
func classEnd(s string, i int) int {
	j := i + 1
	if j < len(s) && (s[j] == '!' || s[j] == '^') {
		j++
	}
	if j < len(s) && s[j] == ']' {
		j++
	}
	for ; j < len(s); j++ {
		switch s[j] {
		case '\\':
			j++
		case ']':
			return j
		}
	}
	return -1
}

// literal is @actions/glob's getLiteral: the name a segment spells when
// it has no wildcard ('\' escapes unescaped, a one-character set such as
// `[.]` its character), and false when it is a glob.
func literal(seg string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		switch {
		case c == '\\' && i+1 < len(seg):
			i++
			b.WriteByte(seg[i])
			continue
		case c == '*' || c == '?':
			return "", false
		case c == '[' && i+1 < len(seg):
			var set strings.Builder
			closed := -1
			for j := i + 1; j < len(seg); j++ {
				if seg[j] == '\\' && j+1 < len(seg) {
					j++
					set.WriteByte(seg[j])
					continue
				}
				if seg[j] == ']' {
					closed = j
					break
				}
				set.WriteByte(seg[j])
			}
			if closed >= 0 {
				if set.Len() > 1 {
					return "", false
				}
				if set.Len() == 1 {
					b.WriteString(set.String())
					i = closed
					continue
				}
			}
		}
		b.WriteByte(c)
	}
	return b.String(), true
}
