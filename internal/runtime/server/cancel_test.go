package server_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/runtime/runtimetest"
)

// A caller that cancels its call ends it in the Runtime Server, not only
// on its own side: the handler (which would sleep 20 s) is stopped and
// the registration takes the next call. Three rounds, since each
// registration's calls share one context in turn: a cancel must neither
// stay on it nor reach the next call.
func TestCallerCancelEndsTheCall(t *testing.T) {
	for _, rt := range []string{"bash", "python"} {
		t.Run(rt, func(t *testing.T) {
			t.Parallel()
			h := runtimetest.Bash(rt)
			if rt == "python" {
				h = runtimetest.Python(rt)
			}
			s := runtimetest.StartServer(t, h, nil)
			reg := s.Register(t, runtimetest.Sleep, "cancel")
			for round := range 3 {
				ctx, cancel := context.WithCancel(context.Background())
				errc := make(chan error, 1)
				go func() {
					_, err := s.Invoke(ctx, reg, `20000`, 30000)
					errc <- err
				}()
				runtimetest.WaitInFlight(t, s, reg)
				cancel()
				if err := <-errc; status.Code(err) != codes.Canceled {
					t.Fatalf("round %d: got %v, want Canceled", round, err)
				}
				waitIdle(t, s, reg)
				resp, err := s.Invoke(context.Background(), reg, `1`, 10000)
				if err != nil || string(resp.GetOutput()) == "" {
					t.Fatalf("round %d: the call after a cancelled one: %v %v", round, resp, err)
				}
			}
		})
	}
}

// waitIdle waits until reg has no invocation in flight, at most 10 s: half
// the cancelled handler's sleep.
func waitIdle(t *testing.T, s *runtimetest.Server, reg *pb.FunctionRegistration) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := s.Functions.FunctionStatus(context.Background(), &pb.FunctionStatusRequest{Registration: reg})
		if err == nil && st.GetInFlight() == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cancelled call is still in flight: %v %v", st, err)
		}
		time.Sleep(2 * time.Millisecond) // polling an observable state, not synchronising on time
	}
}
