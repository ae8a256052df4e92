package runtime

import (
	"context"
	"errors"
	"os"
	"time"

	pb "stoke.dev/stoke/api/executor/v1"
	"stoke.dev/stoke/internal/errdefs"
)

// UnregisterFunction drains or cancels work and removes the generation.
func (f *Functions) UnregisterFunction(ctx context.Context, req *pb.UnregisterFunctionRequest) (*pb.UnregisterFunctionResponse, error) {
	ref := req.GetRegistration()
	if req.GetDrainTimeoutMillis() < 0 {
		return nil, errdefs.InvalidArgument("drain_timeout_millis", "must not be negative")
	}
	r, err := f.lookup(ref)
	if errors.Is(err, errdefs.ErrNotFound) {
		return &pb.UnregisterFunctionResponse{Registration: ref}, nil
	}
	if err != nil {
		return nil, err
	}
	drain := time.Duration(req.GetDrainTimeoutMillis()) * time.Millisecond
	if drain > f.cfg.MaxInvokeTimeout || drain < 0 {
		drain = f.cfg.MaxInvokeTimeout
	}
	if req.GetCancelInFlight() {
		drain = 0
	}
	r.release(ctx, drain)
	r.log.Info("registration unregistered", "cancel_in_flight", req.GetCancelInFlight())
	return &pb.UnregisterFunctionResponse{Registration: r.ref()}, nil
}

// releaseAsync releases a superseded or shut-down generation in the
// background, cancelling its invocation at once.
func (f *Functions) releaseAsync(r *registration, cancelInFlight bool) {
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		var drain time.Duration
		if !cancelInFlight {
			drain = f.cfg.MaxInvokeTimeout
		}
		r.release(context.Background(), drain)
	}()
}

// release moves the generation to DRAINING, lets the invocation in flight
// finish for at most drain, cancels it, and frees every process and file.
// Concurrent callers all return once the generation is released (or ctx
// ends).
func (r *registration) release(ctx context.Context, drain time.Duration) {
	r.mu.Lock()
	if r.state != pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_FAILED {
		r.state = pb.FunctionRegistrationState_FUNCTION_REGISTRATION_STATE_DRAINING
	}
	fl := r.inflight
	r.mu.Unlock()

	r.releaseOnce.Do(func() {
		r.f.wg.Add(1)
		go func() {
			defer r.f.wg.Done()
			defer close(r.released)
			if fl != nil && drain > 0 {
				t := time.NewTimer(drain)
				select {
				case <-fl.done:
				case <-t.C:
				}
				t.Stop()
			}
			if fl != nil {
				fl.drain()
				<-fl.done
			}
			r.cancel() // stops loading and supervision
			<-r.initDone
			r.mu.Lock()
			inst := r.inst
			r.inst = nil
			r.mu.Unlock()
			if inst != nil {
				_ = inst.Close()
			}
			if sc := r.f.cfg.Scopes; sc != nil {
				sc.End(r.id)
			}
			r.out.Close() // its processes are gone: no more output
			// spec.ScratchDir may lie outside scratch, on IPCRoot.
			for _, dir := range []string{r.spec.ScratchDir, r.scratch} {
				if err := os.RemoveAll(dir); err != nil {
					r.log.Warn("removing scratch directory", "dir", dir, "error", err)
				}
			}
			// The generation stayed in the table while it drained, so that
			// FunctionStatus reported DRAINING; it leaves now unless a newer
			// attempt has replaced it meanwhile.
			r.f.mu.Lock()
			if r.f.regs[r.uid] == r {
				delete(r.f.regs, r.uid)
			}
			r.f.mu.Unlock()
		}()
	})
	select {
	case <-r.released:
	case <-ctx.Done():
	}
}
