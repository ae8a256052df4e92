package wfexpr

import (
	"math"
	"sort"
	"strconv"
	"strings"
)

// The coercions below are GitHub's (actions/runner's EvaluationResult):
// what a value is as a boolean, a number and a string, and how two values
// compare when their types differ.

// Truthy is a value as a boolean: null, false, 0, NaN and "" are false;
// every other value, arrays and objects included, is true.
func Truthy(v any) bool {
	switch t := v.(type) {
	case nil:
		return false
	case bool:
		return t
	case float64:
		return t != 0 && !math.IsNaN(t)
	case string:
		return t != ""
	}
	return true
}

// ToNumber is a value as a number: null 0, true 1, false 0, a string
// parsed as a number ("" and blanks are 0; hex 0x.., octal 0o..,
// Infinity and -Infinity; anything else NaN), arrays and objects NaN.
func ToNumber(v any) float64 {
	switch t := v.(type) {
	case nil:
		return 0
	case bool:
		if t {
			return 1
		}
		return 0
	case float64:
		return t
	case string:
		return parseNumber(t)
	}
	return math.NaN()
}

func parseNumber(s string) float64 {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0
	}
	if isDecimal(s) {
		if f, err := strconv.ParseFloat(s, 64); err == nil || isRangeErr(err) {
			return f
		}
	}
	switch {
	case len(s) > 2 && s[0] == '0' && s[1] == 'x' && allIn(s[2:], "0123456789abcdefABCDEF"):
		if n, err := strconv.ParseInt(s[2:], 16, 32); err == nil {
			return float64(n)
		}
	case len(s) > 2 && s[0] == '0' && s[1] == 'o' && allIn(s[2:], "01234567"):
		if n, err := strconv.ParseInt(s[2:], 8, 32); err == nil {
			return float64(n)
		}
	case s == "Infinity":
		return math.Inf(1)
	case s == "-Infinity":
		return math.Inf(-1)
	}
	return math.NaN()
}

func isRangeErr(err error) bool {
	ne, ok := err.(*strconv.NumError)
	return ok && ne.Err == strconv.ErrRange
}

// isDecimal is .NET's AllowLeadingSign|AllowDecimalPoint|AllowExponent:
// digits with an optional sign, point and exponent, nothing else (Go's
// ParseFloat would also take "inf", "0x1p3" and underscores).
func isDecimal(s string) bool {
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	digits := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i, digits = i+1, digits+1
	}
	if i < len(s) && s[i] == '.' {
		i++
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i, digits = i+1, digits+1
		}
	}
	if digits == 0 {
		return false
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		exp := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i, exp = i+1, exp+1
		}
		if exp == 0 {
			return false
		}
	}
	return i == len(s)
}

func allIn(s, set string) bool {
	for _, r := range s {
		if !strings.ContainsRune(set, r) {
			return false
		}
	}
	return true
}

// ToString is a value as a string: null "", booleans "true"/"false",
// numbers as GitHub prints them (.NET's G15: 3, 0.3, 1E+21), arrays
// "Array", objects "Object".
func ToString(v any) string {
	switch t := v.(type) {
	case nil:
		return ""
	case bool:
		return strconv.FormatBool(t)
	case float64:
		return numberString(t)
	case string:
		return t
	case []any:
		return "Array"
	}
	return "Object"
}

// numberString prints a number as .NET's "G15" does, which GitHub uses.
func numberString(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	case f == 0:
		return "0"
	}
	s := strconv.FormatFloat(f, 'g', 15, 64)
	return strings.Replace(s, "e", "E", 1)
}

type kind int

const (
	kindNull kind = iota
	kindBool
	kindNumber
	kindString
	kindArray
	kindObject
)

func kindOf(v any) kind {
	switch v.(type) {
	case nil:
		return kindNull
	case bool:
		return kindBool
	case float64:
		return kindNumber
	case string:
		return kindString
	case []any:
		return kindArray
	}
	return kindObject
}

// coerce brings two values of different kinds to one where GitHub does:
// a number and a string compare as numbers; a boolean or null becomes a
// number first. Other pairs stay apart (and are never equal).
func coerce(l, r any) (any, any) {
	lk, rk := kindOf(l), kindOf(r)
	switch {
	case lk == rk:
	case lk == kindNumber && rk == kindString:
		r = ToNumber(r)
	case lk == kindString && rk == kindNumber:
		l = ToNumber(l)
	case lk == kindBool || lk == kindNull:
		return coerce(ToNumber(l), r)
	case rk == kindBool || rk == kindNull:
		return coerce(l, ToNumber(r))
	}
	return l, r
}

// Equal is GitHub's ==: loose (coerced as above), strings ignoring case,
// NaN equal to nothing, arrays and objects only to themselves.
func Equal(l, r any) bool {
	l, r = coerce(l, r)
	if kindOf(l) != kindOf(r) {
		return false
	}
	switch a := l.(type) {
	case nil:
		return true
	case bool:
		return a == r.(bool)
	case float64:
		return a == r.(float64) // NaN != NaN
	case string:
		return strings.EqualFold(a, r.(string))
	case []any:
		// The same array: arrays are made with room for one element
		// (ParseJSON), so that two empty ones are told apart too.
		b := r.([]any)
		return len(a) == len(b) && cap(a) > 0 && cap(b) > 0 && &a[:1][0] == &b[:1][0]
	}
	return l.(*Object) == r.(*Object)
}

// compare orders two values as GitHub's <, <=, > and >= do: after
// coercion, numbers (NaN with nothing), strings ignoring case, false
// before true. ok is false when they do not compare (then every relation
// is false).
func compare(l, r any) (cmp int, ok bool) {
	l, r = coerce(l, r)
	if kindOf(l) != kindOf(r) {
		return 0, false
	}
	switch a := l.(type) {
	case float64:
		b := r.(float64)
		switch {
		case math.IsNaN(a) || math.IsNaN(b):
			return 0, false
		case a < b:
			return -1, true
		case a > b:
			return 1, true
		}
		return 0, true
	case string:
		return strings.Compare(strings.ToUpper(a), strings.ToUpper(r.(string))), true
	case bool:
		b := r.(bool)
		switch {
		case a == b:
			return 0, true
		case b:
			return -1, true
		}
		return 1, true
	}
	return 0, false
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
