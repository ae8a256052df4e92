package validation

import (
	"bytes"
	"errors"
	"io"
	"unicode/utf8"

	yaml "go.yaml.in/yaml/v3"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
)

// Rules for the text of an object as a client sends it, before it is
// decoded: every decoder of a client's Runs and Runtimes (the HTTP API's
// bodies, `stoke apply`'s files) applies them.

// UTF8 refuses text that is not UTF-8. JSON and YAML are UTF-8; Go's JSON
// decoder would take each bad byte for U+FFFD and store what the client
// never sent.
func UTF8(field string, b []byte) error {
	if utf8.Valid(b) {
		return nil
	}
	at := 0
	for at < len(b) {
		r, n := utf8.DecodeRune(b[at:])
		if r == utf8.RuneError && n == 1 {
			break
		}
		at += n
	}
	return errdefs.InvalidArgument(field, "is not UTF-8 text: byte %d is %#02x", at, b[at])
}

// YAMLExpansion refuses YAML text whose aliases expand it (all its
// documents together) past
// bounds.ObjectJSON bytes: an object that large is refused anyway, and a
// 4 MiB document of aliases of one 4 MB value would otherwise expand to
// gigabytes in the decoder, whose own alias check counts nodes, not
// bytes. The expansion is counted without expanding anything — each
// anchored node's size once — so that the check's work and memory follow
// the document's size. A document without both an anchor ('&') and an
// alias ('*') is not parsed here at all.
func YAMLExpansion(field string, doc []byte) error {
	if bytes.IndexByte(doc, '&') < 0 || bytes.IndexByte(doc, '*') < 0 {
		return nil
	}
	s := expansion{sizes: map[*yaml.Node]int{}, open: map[*yaml.Node]bool{}, limit: bounds.ObjectJSON}
	dec := yaml.NewDecoder(bytes.NewReader(doc))
	total := 0
	for {
		var root yaml.Node
		err := dec.Decode(&root)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			// A document this parser cannot read is not measured: refused,
			// rather than handed to the decoder unmeasured.
			return errdefs.InvalidArgument(field, "not valid YAML: %s", bounds.Truncate(err.Error(), bounds.Quoted*4))
		}
		size, err := s.size(&root)
		switch {
		case errors.Is(err, errAliasCycle):
			return errdefs.InvalidArgument(field, "a YAML alias refers to a node that holds it")
		case err != nil || total+size > s.limit:
			return errdefs.InvalidArgument(field, "its YAML aliases expand it past %d bytes, more than an object may hold; write the values out", bounds.ObjectJSON)
		}
		total += size
	}
}

var (
	errAliasCycle = errors.New("alias cycle")
	errExpansion  = errors.New("expands past the bound")
)

// expansion counts what a YAML node expands to: its scalars' bytes and one
// byte for each node (so that aliases of empty nodes count too).
type expansion struct {
	sizes map[*yaml.Node]int  // of anchored nodes, once counted
	open  map[*yaml.Node]bool // anchored nodes being counted
	limit int
}

func (s *expansion) size(n *yaml.Node) (int, error) {
	if n == nil {
		return 0, nil
	}
	if n.Kind == yaml.AliasNode {
		return s.size(n.Alias)
	}
	if n.Anchor != "" {
		if size, ok := s.sizes[n]; ok {
			return size, nil
		}
		if s.open[n] {
			return 0, errAliasCycle
		}
		s.open[n] = true
		defer delete(s.open, n)
	}
	total := 1
	if n.Kind == yaml.ScalarNode {
		total += len(n.Value)
	}
	for _, c := range n.Content {
		size, err := s.size(c)
		if err != nil {
			return 0, err
		}
		if total += size; total > s.limit {
			return 0, errExpansion
		}
	}
	if total > s.limit {
		return 0, errExpansion
	}
	if n.Anchor != "" {
		s.sizes[n] = total
	}
	return total, nil
}
