package runtimed

import (
	"time"

	"google.golang.org/grpc"

	rdpb "stoke.dev/stoke/api/runtimed/v1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/runlog"
)

// logChunk bounds one message of a log stream.
const logChunk = 64 << 10

// followPoll is how often a follower looks at its Run's worker without a
// write to wake it.
const followPoll = 250 * time.Millisecond

// followGrace is how long a follower of a Run this runtimed has no worker
// for, and has not seen end, waits for one (its informer may not have
// delivered the assignment yet) before it ends the stream.
const followGrace = 5 * time.Second

// endedKept bounds how many ended Runs the daemon remembers for its log
// followers.
const endedKept = 4096

// LogService is runtimed.v1 Logs on the hop: the logs of the Runs this
// pod ran, which the Runtime Server writes to logs' directory. A follow
// ends once the Run's worker has ended here (it writes the Run's end
// after the Runtime Server wrote the Run's every record) and the last
// records are out.
func (d *Daemon) LogService(logs *runlog.Store) rdpb.LogsServer {
	return &logService{d: d, logs: logs}
}

type logService struct {
	rdpb.UnimplementedLogsServer
	d    *Daemon
	logs *runlog.Store
}

func (s *logService) ReadLog(req *rdpb.ReadLogRequest, stream grpc.ServerStreamingServer[rdpb.ReadLogResponse]) error {
	uid := req.GetRunUid()
	if uid == "" || len(uid) > bounds.RunUID {
		return errdefs.InvalidArgument("run_uid", "must be 1 to %d bytes", bounds.RunUID)
	}
	ctx := stream.Context()
	rd, err := s.logs.Open(uid)
	if err != nil {
		return err
	}
	defer rd.Close()
	opened := time.Now()
	var poll *time.Ticker
	for {
		changed := s.logs.Changed() // before reading, so no write is missed
		last := !req.GetFollow()
		if !last {
			live, ended := s.d.runState(uid)
			last = ended || (!live && time.Since(opened) > followGrace)
		}
		for {
			chunk, err := rd.Next(logChunk)
			if err != nil {
				return errdefs.Errorf(errdefs.ErrInternal, "run %s: reading its log: %v", uid, err)
			}
			if chunk == nil {
				break
			}
			if err := stream.Send(&rdpb.ReadLogResponse{Data: chunk}); err != nil {
				return err
			}
		}
		if last {
			return nil
		}
		if poll == nil {
			poll = time.NewTicker(followPoll)
			defer poll.Stop()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		case <-poll.C:
		}
	}
}

// runState says whether the Run uid has a worker here (live) or had one
// that ended (ended).
func (d *Daemon) runState(uid string) (live, ended bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.workers[uid] != nil {
		return true, false
	}
	_, ended = d.ended[uid]
	return false, ended
}

// workerEnded remembers that uid's worker ended; d.mu is held. The oldest
// go first past endedKept.
func (d *Daemon) workerEnded(uid string) {
	if _, ok := d.ended[uid]; ok {
		return
	}
	d.ended[uid] = struct{}{}
	d.endedOrder = append(d.endedOrder, uid)
	if len(d.endedOrder) > endedKept {
		delete(d.ended, d.endedOrder[0])
		d.endedOrder = d.endedOrder[1:]
	}
}
