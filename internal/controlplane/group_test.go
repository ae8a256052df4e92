package controlplane

import (
	"context"
	"errors"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waiter is a component that runs until its context ends.
func waiter(stopped chan<- struct{}) Component {
	return Component{"waiter", func(ctx context.Context) error {
		<-ctx.Done()
		close(stopped)
		return nil
	}}
}

func TestRunStopsAllWhenOneFails(t *testing.T) {
	stopped := make(chan struct{})
	boom := errors.New("boom")
	err := Run(t.Context(), nil, waiter(stopped), Component{"breaker", func(context.Context) error { return boom }})
	if !errors.Is(err, boom) || !strings.HasPrefix(err.Error(), "breaker: ") {
		t.Fatalf("Run = %v, want the breaker's error by name", err)
	}
	select {
	case <-stopped:
	default:
		t.Fatal("Run returned before the other component stopped")
	}
}

func TestRunEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	stopped := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, nil, waiter(stopped), Component{"quiet", func(context.Context) error { return nil }})
	}()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v after its context ended", err)
	}
	<-stopped
}
