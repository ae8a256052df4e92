package bash

import (
	"testing"
	"time"
)

func TestSmoke(t *testing.T) {
	f := newFixture(t, map[string]string{"handler.sh": "handle() { echo \"x: $1\" >&2; printf '%s' \"$1\"; }\n"})
	in := f.mustLoad("handler.handle")
	for i := 0; i < 5; i++ {
		res, err := f.invoke(in, `{"a":1}`, 5*time.Second)
		t.Logf("%q %v %v", res.Output, res.Outputs, err)
	}
	t.Log(f.rec.stderrLines())
}
