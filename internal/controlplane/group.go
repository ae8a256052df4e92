package controlplane

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"stoke.dev/stoke/internal/logging"
)

// Component is one long-running part of a control plane: Run returns nil
// when its context ends, an error when it fails.
type Component struct {
	Name string
	Run  func(ctx context.Context) error
}

// Run runs every component until ctx ends or one of them fails; then it
// cancels the others and returns once all have returned: nil after ctx
// ended, else the first failure, named after its component.
func Run(ctx context.Context, log *slog.Logger, components ...Component) error {
	log = logging.OrDiscard(log)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, len(components))
	var wg sync.WaitGroup
	for _, c := range components {
		wg.Go(func() {
			if err := c.Run(ctx); err != nil && ctx.Err() == nil {
				errc <- fmt.Errorf("%s: %w", c.Name, err)
			}
		})
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		log.Error("control plane component failed", "error", err)
	}
	cancel()
	wg.Wait()
	return err
}
