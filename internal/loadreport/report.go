package loadreport

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// The record's marks and bounds.
const (
	// Label marks a gateway's load record (value "true"); the reader
	// lists only Leases that carry it.
	Label = "stoke.dev/gateway-load"
	// Annotation holds the record's loads.
	Annotation = "stoke.dev/function-load"
	// NamePrefix is the record's name before its Pod's name.
	NamePrefix = "stoke-gateway-load-"
	// LeaseDuration is how long a record counts after the reader last saw
	// it change; a writer with load refreshes it well within that.
	LeaseDuration = 30 * time.Second
	// MaxFunctions bounds the Functions one record shows (the busiest
	// first): an annotation's value must stay well within the API
	// server's 256 KiB for all of an object's annotations.
	MaxFunctions = 2000
)

// Load is one Function's load in one gateway.
type Load struct {
	InFlight int `json:"i"`
	Queued   int `json:"q"`
}

// Report is the loads a record shows, by "namespace/name" (only Functions
// with load).
type Report map[string]Load

// Key is a report's key for a Function.
func Key(namespace, name string) string { return namespace + "/" + name }

// encode is r as the annotation's value, at most MaxFunctions entries
// (the busiest).
func (r Report) encode() (string, error) {
	if len(r) > MaxFunctions {
		keys := slices.SortedFunc(maps.Keys(r), func(a, b string) int {
			la, lb := r[a], r[b]
			return cmp.Or(cmp.Compare(lb.InFlight+lb.Queued, la.InFlight+la.Queued), strings.Compare(a, b))
		})
		kept := make(Report, MaxFunctions)
		for _, k := range keys[:MaxFunctions] {
			kept[k] = r[k]
		}
		r = kept
	}
	b, err := json.Marshal(r)
	if err != nil {
		return "", fmt.Errorf("encode the function loads: %w", err)
	}
	return string(b), nil
}

// decode reads an annotation's value; entries with a negative count are
// dropped.
func decode(s string) (Report, error) {
	if s == "" {
		return Report{}, nil
	}
	var r Report
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		return nil, fmt.Errorf("decode the function loads: %w", err)
	}
	for k, l := range r {
		if l.InFlight < 0 || l.Queued < 0 || l.InFlight+l.Queued == 0 {
			delete(r, k)
		}
	}
	return r, nil
}
