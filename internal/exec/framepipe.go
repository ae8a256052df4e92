package exec

import (
	"io"
	"sync"
)

// framePipe passes frames, each in pieces, from the goroutine that receives
// them to one reader, as io.Pipe passes a slice: put returns once Read has
// taken the whole frame, so nothing waits beyond the frame in hand and the
// sender is held back by its stream's flow control. Read copies as much of
// the frame as fits, across its pieces, so a frame that arrived in pieces
// still reaches the command in one write.
type framePipe struct {
	frames chan [][]byte
	taken  chan struct{}

	wonce sync.Once
	wdone chan struct{} // closed by close; werr says why
	werr  error

	ronce sync.Once
	rdone chan struct{} // closed by closeRead

	cur [][]byte // the reader's frame in hand
}

func newFramePipe() *framePipe {
	return &framePipe{frames: make(chan [][]byte), taken: make(chan struct{}), wdone: make(chan struct{}), rdone: make(chan struct{})}
}

// put hands a frame to the reader and waits until it has taken all of it.
// After io.ErrClosedPipe the reader may still hold the pieces.
func (p *framePipe) put(pieces [][]byte) error {
	empty := true
	for _, b := range pieces {
		empty = empty && len(b) == 0
	}
	if empty {
		return nil
	}
	select {
	case p.frames <- pieces:
	case <-p.rdone:
		return io.ErrClosedPipe
	}
	select {
	case <-p.taken:
		return nil
	case <-p.rdone:
		return io.ErrClosedPipe
	}
}

// close ends the frames: Read returns err, io.EOF when nil. Called by the
// goroutine that calls put, after it.
func (p *framePipe) close(err error) {
	p.wonce.Do(func() {
		if err == nil {
			err = io.EOF
		}
		p.werr = err
		close(p.wdone)
	})
}

// closeRead ends the reader's side: put and Read return io.ErrClosedPipe.
func (p *framePipe) closeRead() {
	p.ronce.Do(func() { close(p.rdone) })
}

func (p *framePipe) Read(b []byte) (int, error) {
	if p.cur == nil {
		select {
		case p.cur = <-p.frames:
		case <-p.wdone:
			return 0, p.werr
		case <-p.rdone:
			return 0, io.ErrClosedPipe
		}
	}
	n := 0
	for n < len(b) && len(p.cur) > 0 {
		k := copy(b[n:], p.cur[0])
		n += k
		if k < len(p.cur[0]) {
			p.cur[0] = p.cur[0][k:]
		} else {
			p.cur = p.cur[1:]
		}
	}
	if len(p.cur) == 0 {
		p.cur = nil
		select {
		case p.taken <- struct{}{}:
		case <-p.rdone:
		}
	}
	return n, nil
}
