package gateway

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/randid"
)

// An invocation ID the gateway makes (randid's, tested there) is one the
// gateway takes from a client.
func TestOwnInvocationIDIsTaken(t *testing.T) {
	for range 100 {
		if id := randid.New("inv_"); checkInvocationID(id) != nil {
			t.Fatalf("the gateway refuses its own ID %q: %v", id, checkInvocationID(id))
		}
	}
}

// The series of an invocation answered 200, resolved once, count as the
// others do, and appear with the first such answer.
func TestInvokeMetrics(t *testing.T) {
	m := NewMetrics(nil)
	// value is the counter's value or the histogram's count and sum of
	// the series of family name with the label name=value; found says
	// whether there is one.
	value := func(family, label, want string) (v, sum float64, found bool) {
		t.Helper()
		mfs, err := m.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != family {
				continue
			}
			for _, s := range mf.GetMetric() {
				for _, l := range s.GetLabel() {
					if l.GetName() == label && l.GetValue() == want {
						if h := s.GetHistogram(); h != nil {
							return float64(h.GetSampleCount()), h.GetSampleSum(), true
						}
						return s.GetCounter().GetValue(), 0, true
					}
				}
			}
		}
		return 0, 0, false
	}
	if _, _, found := value("stoke_invocations_total", "code", "200"); found {
		t.Fatal("a 200 series before any call")
	}
	if _, _, found := value("stoke_gateway_requests_total", "route", invokeRoute); found {
		t.Fatal("an invoke route series before any call")
	}
	for _, c := range []struct {
		status int
		d      time.Duration
	}{{http.StatusOK, time.Millisecond}, {http.StatusTooManyRequests, 4 * time.Millisecond}, {http.StatusOK, 2 * time.Millisecond}} {
		m.observeInvoke(c.status, c.d)
		m.observeRequest(invokeRoute, c.status, c.d)
	}
	m.observeRequest("objects", http.StatusOK, 8*time.Millisecond)
	for _, c := range []struct {
		family, label, value string
		want, sum            float64
	}{
		{"stoke_invocations_total", "code", "200", 2, 0},
		{"stoke_invocations_total", "code", "429", 1, 0},
		{"stoke_invocation_duration_seconds", "code", "200", 2, 0.003},
		{"stoke_invocation_duration_seconds", "code", "429", 1, 0.004},
		{"stoke_gateway_request_duration_seconds", "route", invokeRoute, 3, 0.007},
		{"stoke_gateway_request_duration_seconds", "route", "objects", 1, 0.008},
	} {
		got, sum, found := value(c.family, c.label, c.value)
		if !found || got != c.want || (c.sum != 0 && (sum < c.sum-1e-9 || sum > c.sum+1e-9)) {
			t.Errorf("%s{%s=%q}: %v (sum %v, present %v), want %v (sum %v)", c.family, c.label, c.value, got, sum, found, c.want, c.sum)
		}
	}
	mfs, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	requests := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "stoke_gateway_requests_total" {
			for _, s := range mf.GetMetric() {
				key := ""
				for _, l := range s.GetLabel() {
					key += l.GetName() + "=" + l.GetValue() + " "
				}
				requests[key] = s.GetCounter().GetValue()
			}
		}
	}
	for key, want := range map[string]float64{"code=200 route=invoke ": 2, "code=429 route=invoke ": 1, "code=200 route=objects ": 1} {
		if requests[key] != want {
			t.Errorf("stoke_gateway_requests_total %s= %v, want %v (all: %v)", key, requests[key], want, requests)
		}
	}
}

// A body with a Content-Length within the limit is read into a buffer of
// exactly its size (one allocation, nothing spare for the invocation's
// Input to carry); a body shorter than it says is refused, and one
// larger than the limit is still ErrTooLarge.
func TestReadBodySized(t *testing.T) {
	const in = `{"command":"status"}`
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(in))
	body, err := readBody(httptest.NewRecorder(), r, 1024)
	if err != nil || string(body) != in {
		t.Fatalf("readBody: %q, %v; want %q", body, err, in)
	}
	if cap(body) != len(in) {
		t.Errorf("the body's buffer holds %d bytes for a body of %d", cap(body), len(in))
	}

	short := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(in))
	short.ContentLength = int64(len(in)) + 5
	if _, err := readBody(httptest.NewRecorder(), short, 1024); errdefs.Code(err) != codes.InvalidArgument {
		t.Errorf("a body shorter than its Content-Length: %v, want InvalidArgument", err)
	}

	large := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(in))
	if _, err := readBody(httptest.NewRecorder(), large, int64(len(in))-1); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Errorf("a body over the limit: %v, want ErrTooLarge", err)
	}
}
