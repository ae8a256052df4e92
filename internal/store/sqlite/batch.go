package sqlite

import (
	"context"
	"database/sql"
	"fmt"
)

// Group commit. Every write is one operation (writeFunc) run by core.write.
// Writes that arrive while a transaction is being written wait, and the
// next of them to lead runs all of them in one transaction with one
// COMMIT: under concurrency the cost of BEGIN, COMMIT and the WAL pages
// they write is shared, and an uncontended write is one transaction as
// before. No write is delayed to wait for others, and a write returns only
// once its transaction has committed, so a returned write is as durable
// as with a transaction of its own (see the package doc).
//
// Each operation of a batch of several runs inside a SAVEPOINT, so that
// one that fails (a conflict, a missing object, a name taken) leaves the
// others as they were; versions are handed out in batch order, so they
// stay consecutive and the event log in commit order. A batch whose COMMIT
// fails fails every operation that wrote in it.

// maxBatch bounds how many writes share one transaction.
const maxBatch = 256

// writeFunc is one write, run under c.mu inside the batch's transaction
// tx. rv is the resourceVersion it writes if it writes. It returns nil
// after and nil error when it wrote nothing (its own result stands);
// otherwise after is called once the batch has committed (it hands the
// change to the watchers).
type writeFunc func(ctx context.Context, tx *sql.Tx, rv int64) (after func(), err error)

// writeOp is one write waiting for, or in, a batch.
type writeOp struct {
	run   writeFunc
	ran   bool // its savepoint, if any, was released: its outcome stands
	wrote bool
	err   error
	done  chan struct{} // closed once err is set
	lead  chan struct{} // closed when this op is to lead the next batch
}

// write runs fn in a batch and returns its error. ctx only gates the
// start: once in a batch, a write runs to its end (a write cancelled half
// way would be worth nothing, and one cancelled during COMMIT could leave
// its outcome unknown).
func (c *core) write(ctx context.Context, fn writeFunc) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	op := &writeOp{run: fn, done: make(chan struct{}), lead: make(chan struct{})}
	c.qmu.Lock()
	c.queue = append(c.queue, op)
	leader := !c.leading
	c.leading = true
	c.qmu.Unlock()
	if !leader {
		select {
		case <-op.done:
			return op.err
		case <-op.lead:
		}
	}
	c.qmu.Lock()
	batch := c.queue
	if len(batch) > maxBatch {
		batch = batch[:maxBatch]
	}
	c.queue = c.queue[len(batch):]
	c.qmu.Unlock()
	c.runBatch(batch)
	// Hand over to the first write that arrived meanwhile, if any.
	c.qmu.Lock()
	if len(c.queue) > 0 {
		close(c.queue[0].lead)
	} else {
		c.leading = false
	}
	c.qmu.Unlock()
	<-op.done
	return op.err
}

// runBatch runs the writes of batch in one transaction and answers each.
func (c *core) runBatch(batch []*writeOp) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var afters []func()
	// finish answers every write: err (the batch failed) goes to each
	// that has no error of its own and wrote, or did not run to its end.
	finish := func(err error) {
		for _, op := range batch {
			if op.err == nil && (op.wrote || !op.ran) {
				op.err = err
			}
		}
		if err == nil {
			for _, after := range afters {
				after()
			}
		}
		for _, op := range batch {
			close(op.done)
		}
	}
	if c.closed {
		finish(errClosed())
		return
	}
	ctx := context.Background()
	tx, err := c.w.BeginTx(ctx, nil)
	if err != nil {
		finish(fmt.Errorf("begin: %w", err))
		return
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	savepoints := len(batch) > 1
	rv := c.rv
	for _, op := range batch {
		if savepoints {
			if _, err := tx.ExecContext(ctx, `SAVEPOINT w`); err != nil {
				c.resetCaches()
				finish(fmt.Errorf("savepoint: %w", err))
				return
			}
		}
		after, err := op.run(ctx, tx, rv+1)
		if savepoints {
			if err != nil {
				_, rerr := tx.ExecContext(ctx, `ROLLBACK TO w`)
				if rerr != nil {
					c.resetCaches()
					finish(fmt.Errorf("%w; rolling it back: %v", err, rerr))
					return
				}
			}
			if _, rerr := tx.ExecContext(ctx, `RELEASE w`); rerr != nil {
				c.resetCaches()
				finish(fmt.Errorf("release savepoint: %w", rerr))
				return
			}
		}
		op.ran = true
		switch {
		case err != nil:
			op.err = err
		case after != nil:
			rv++
			op.wrote = true
			afters = append(afters, after)
		}
	}
	if len(afters) == 0 {
		finish(nil) // nothing written: the transaction is rolled back
		return
	}
	if err := c.commit(ctx, tx, rv, int64(len(afters))); err != nil {
		// The operations put their new states in the write caches.
		c.resetCaches()
		finish(err)
		return
	}
	finish(nil)
}

// resetCaches forgets every kind's write cache, which may hold states of
// a batch that did not commit; the caller holds mu.
func (c *core) resetCaches() {
	for _, k := range c.kinds {
		k.resetCache()
	}
}
