package gateway

import (
	"context"
	"io"
	"time"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/runlog"
)

// StoreLogReader is standalone's LogReader (the Docker API's too): the logs of api's directory,
// a follower looking at its Run in api's memory at every write to any
// log and at least every poll.
func StoreLogReader(api API, poll time.Duration) LogReader {
	return &storeLogs{api: api, poll: poll}
}

type storeLogs struct {
	api  API
	poll time.Duration
}

func (s *storeLogs) OpenLog(ctx context.Context, ns, name string, follow bool) (LogStream, error) {
	run, err := s.api.GetRun(ctx, ns, name)
	if err != nil {
		return nil, err
	}
	logs := s.api.Logs()
	rd, err := logs.Open(string(run.UID))
	if err != nil {
		return nil, err
	}
	return &storeLog{s: s, logs: logs, rd: rd, ns: ns, name: name, uid: string(run.UID), run: run, follow: follow}, nil
}

// storeLog reads in rounds: each takes the change signal before reading
// (so no write is missed), reads what is there, and waits; the round
// that begins with the Run terminal (or gone) is the last, because the
// Runtime Server writes a Run's records before it reports its end.
type storeLog struct {
	s             *storeLogs
	logs          *runlog.Store
	rd            *runlog.Reader
	ns, name, uid string
	run           *v1alpha1.Run // nil once deleted
	follow        bool
	inRound, last bool
	ended         bool
	changed       <-chan struct{}
	poll          *time.Ticker
}

func (l *storeLog) Next(ctx context.Context) ([]byte, error) {
	for {
		if l.ended {
			return nil, io.EOF
		}
		if !l.inRound {
			l.changed = l.logs.Changed()
			l.last = !l.follow || l.run == nil || string(l.run.UID) != l.uid || l.run.Status.Phase.Terminal()
			l.inRound = true
		}
		chunk, err := l.rd.Next(logChunk)
		if err != nil {
			return nil, err
		}
		if chunk != nil {
			return chunk, nil
		}
		l.inRound = false
		if l.last {
			l.ended = true
			return nil, io.EOF
		}
		if l.poll == nil {
			l.poll = time.NewTicker(l.s.poll)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-l.changed:
		case <-l.poll.C:
		}
		l.run = l.current(ctx)
	}
}

// current reads the followed Run from memory, or from the store while
// memory has not caught up with its creation; nil once it is deleted.
func (l *storeLog) current(ctx context.Context) *v1alpha1.Run {
	if run, ok := l.s.api.CachedRun(l.ns, l.name); ok {
		return run
	}
	run, err := l.s.api.GetRun(ctx, l.ns, l.name)
	if err != nil {
		return nil
	}
	return run
}

func (l *storeLog) Close() error {
	if l.poll != nil {
		l.poll.Stop()
	}
	return l.rd.Close()
}
