package payload_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"stoke.dev/stoke/internal/lambda/payload"
)

func TestInvokeEventIsTheRequest(t *testing.T) {
	for _, tc := range []struct {
		id      string
		timeout int64
		input   string
	}{
		{"inv_1", 1500, `{"hello":"world"}`},
		{`inv "quoted" \ <&>`, 0, `"a <b> & c"`},
		{"", 1, `[1, 2,  {"x": null}]`},
		{"inv_é\n\x7f\x00", 7, `1`},
	} {
		ev := payload.InvokeEvent(tc.id, tc.timeout, json.RawMessage(tc.input))
		var got payload.Request
		if err := json.Unmarshal(ev, &got); err != nil {
			t.Fatalf("%s: %v", ev, err)
		}
		if got.Kind != payload.KindInvoke || got.InvocationID != tc.id || got.TimeoutMillis != tc.timeout {
			t.Fatalf("%s decodes to %+v", ev, got)
		}
		// The input is carried byte for byte: not compacted, not escaped.
		if !bytes.Equal(got.Input, []byte(tc.input)) {
			t.Fatalf("input %s, want %s", got.Input, tc.input)
		}
	}
}
