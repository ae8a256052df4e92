package wfexpr

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// A value is one of: nil (null), bool, float64 (every number), string,
// []any (an array), or *Object. Objects keep their keys' order (toJSON
// writes them back in it) and look keys up ignoring case, as GitHub does.

// Object is an ordered map whose keys are looked up ignoring case.
type Object struct {
	keys  []string
	vals  []any
	index map[string]int // lower-cased key → position
}

// NewObject returns an empty Object.
func NewObject() *Object { return &Object{index: map[string]int{}} }

// Set sets key (replacing a key that differs only in case).
func (o *Object) Set(key string, v any) {
	lk := strings.ToLower(key)
	if i, ok := o.index[lk]; ok {
		o.vals[i] = v
		return
	}
	o.index[lk] = len(o.keys)
	o.keys = append(o.keys, key)
	o.vals = append(o.vals, v)
}

// Get looks key up ignoring case.
func (o *Object) Get(key string) (any, bool) {
	i, ok := o.index[strings.ToLower(key)]
	if !ok {
		return nil, false
	}
	return o.vals[i], true
}

// Keys returns the keys in order.
func (o *Object) Keys() []string { return o.keys }

// Len is the number of keys.
func (o *Object) Len() int { return len(o.keys) }

// objectOf builds an Object from a string map, keys sorted by the caller's
// order (nil means map order is not kept: keys are sorted).
func objectOfStrings(m map[string]string) *Object {
	o := NewObject()
	for _, k := range sortedKeys(m) {
		o.Set(k, m[k])
	}
	return o
}

// ParseJSON decodes JSON text into a value (objects keep their order).
func ParseJSON(text string) (any, error) {
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("invalid JSON: text after the value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		if err == io.EOF {
			return nil, errors.New("invalid JSON: no value")
		}
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			o := NewObject()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, fmt.Errorf("invalid JSON: %w", err)
				}
				k, _ := kt.(string)
				v, err := decodeValue(dec)
				if err != nil {
					return nil, err
				}
				o.Set(k, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, fmt.Errorf("invalid JSON: %w", err)
			}
			return o, nil
		case '[':
			a := make([]any, 0, 1) // never zero capacity: see Equal
			for dec.More() {
				v, err := decodeValue(dec)
				if err != nil {
					return nil, err
				}
				a = append(a, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, fmt.Errorf("invalid JSON: %w", err)
			}
			return a, nil
		}
		return nil, fmt.Errorf("invalid JSON: unexpected %v", t)
	case json.Number:
		f, err := strconv.ParseFloat(string(t), 64)
		if err != nil {
			return nil, fmt.Errorf("invalid JSON number %s: %w", t, err)
		}
		return f, nil
	case string, bool, nil:
		return t, nil
	}
	return nil, fmt.Errorf("invalid JSON: unexpected %v", tok)
}

// ToJSON writes v as JSON: indented by two spaces as GitHub's toJSON
// does, or compact.
func ToJSON(v any, indent bool) string {
	var b bytes.Buffer
	writeJSON(&b, v, indent, "")
	return b.String()
}

func writeJSON(b *bytes.Buffer, v any, indent bool, prefix string) {
	nl := func(p string) {
		if indent {
			b.WriteByte('\n')
			b.WriteString(p)
		}
	}
	switch t := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(t))
	case float64:
		if math.IsNaN(t) || math.IsInf(t, 0) {
			// JSON has no NaN or Infinity; GitHub writes them as numbers
			// would print, which is not JSON either: say null.
			b.WriteString("null")
			return
		}
		b.WriteString(numberString(t))
	case string:
		quoteJSON(b, t)
	case []any:
		if len(t) == 0 {
			b.WriteString("[]")
			return
		}
		b.WriteByte('[')
		for i, e := range t {
			if i > 0 {
				b.WriteByte(',')
			}
			nl(prefix + "  ")
			writeJSON(b, e, indent, prefix+"  ")
		}
		nl(prefix)
		b.WriteByte(']')
	case *Object:
		if t.Len() == 0 {
			b.WriteString("{}")
			return
		}
		b.WriteByte('{')
		for i, k := range t.keys {
			if i > 0 {
				b.WriteByte(',')
			}
			nl(prefix + "  ")
			quoteJSON(b, k)
			b.WriteByte(':')
			if indent {
				b.WriteByte(' ')
			}
			writeJSON(b, t.vals[i], indent, prefix+"  ")
		}
		nl(prefix)
		b.WriteByte('}')
	default:
		b.WriteString("null")
	}
}

// quoteJSON writes s as a JSON string, leaving <, > and & as they are (as
// GitHub's toJSON does).
func quoteJSON(b *bytes.Buffer, s string) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)       // a string always encodes
	b.Truncate(b.Len() - 1) // Encode's newline
}
