package exec_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"testing"

	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/exec"
)

// attachTarget is a task whose Attachment the test drives: the test is
// its output pump and reads its stdin pipe.
type attachTarget struct {
	a     *exec.Attachment
	ended chan struct{}
}

func (a attachTarget) ExecTarget(string, string) (exec.Target, error) {
	return exec.Target{Dir: "/", Ended: a.ended, Attach: a.a}, nil
}

// The first session gets what the task wrote before it (the last
// bounds.AttachReplay bytes), a later one only what follows its join;
// StdinOnce's EOF closes the task's stdin, another session's EOF does not;
// both end with the task's exit.
func TestAttachReplayAndStdinOnce(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	a := exec.NewAttachment(os.Getpid(), w, false)
	l := exec.NewLocal(exec.LocalConfig{Targets: attachTarget{a: a, ended: make(chan struct{})}})
	defer l.Close()
	ctx := context.Background()

	early := strings.Repeat("x", bounds.AttachReplay) + "early"
	if _, err := io.WriteString(a.Output(1), early); err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(a.Output(2), "warn")

	type result struct {
		out, errOut bytes.Buffer
		exit        exec.Exit
		err         error
	}
	stream := func(req exec.Request, stdin io.Reader) (*result, chan struct{}) {
		s, err := l.Start(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		res, done := &result{}, make(chan struct{})
		go func() {
			defer close(done)
			defer s.Close()
			res.exit, res.err = s.Stream(ctx, exec.Streams{Stdin: stdin, Stdout: &res.out, Stderr: &res.errOut})
		}()
		return res, done
	}
	// A session that only controls (resizes) takes no output, and leaves
	// the held output to the first that does.
	control, controlDone := stream(exec.Request{RunUID: "t", Attach: true, ControlOnly: true}, nil)
	// Not StdinOnce: its EOF leaves the task's stdin open.
	first, firstDone := stream(exec.Request{RunUID: "t", Attach: true, Stdin: true}, strings.NewReader("one "))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(r, buf); err != nil || string(buf) != "one " {
		t.Fatalf("task's stdin: %q, %v", buf, err)
	}
	second, secondDone := stream(exec.Request{RunUID: "t", Attach: true, Stdin: true, StdinOnce: true}, strings.NewReader("two"))
	if got, err := io.ReadAll(r); err != nil || string(got) != "two" {
		t.Fatalf("task's stdin after StdinOnce's EOF: %q, %v; want two, then EOF", got, err)
	}
	if _, err := io.WriteString(a.Output(1), "late"); err != nil {
		t.Fatal(err)
	}
	a.Finish(exec.Exit{Code: 3})
	<-firstDone
	<-secondDone
	<-controlDone
	if control.err != nil || control.exit.Code != 3 || control.out.Len() != 0 || control.errOut.Len() != 0 {
		t.Errorf("control session: %+v, %v, %d and %d bytes of output; want exit 3 and none", control.exit, control.err, control.out.Len(), control.errOut.Len())
	}
	for name, res := range map[string]*result{"first": first, "second": second} {
		if res.err != nil || res.exit.Code != 3 {
			t.Errorf("%s: Stream = %+v, %v; want exit 3", name, res.exit, res.err)
		}
	}
	if want := early[len(early)-bounds.AttachReplay:] + "late"; first.out.String() != want || first.errOut.String() != "warn" {
		t.Errorf("first session: %d bytes of stdout ending %q, stderr %q; want the last %d bytes before it and late, warn",
			first.out.Len(), first.out.String()[max(0, first.out.Len()-10):], first.errOut.String(), bounds.AttachReplay)
	}
	if second.out.String() != "late" || second.errOut.String() != "" {
		t.Errorf("second session: stdout %q, stderr %q; want late only", second.out.String(), second.errOut.String())
	}
}
