// Package sqlite is the Run store of standalone mode: the store.Store
// interface over one embedded SQLite database file, stoke.db, in a data
// directory, through the pure-Go driver modernc.org/sqlite (no cgo).
//
// The database has two tables. objects holds the current state of every Run
// and Runtime (kind, namespace, name, uid, resource_version, phase and the
// object as JSON). events is the change log that Watch replays: one row per
// write, keyed by the resourceVersion the write produced. Every write changes
// objects and appends to events in one transaction, and writes are
// serialised in-process by one mutex around one writer connection, so
// resourceVersions are consecutive integers, event order is commit order,
// and the log has no gaps. Writes that arrive while a transaction commits
// share the next one, each in a savepoint of its own (group commit,
// batch.go); none is delayed to wait for others, and none returns before
// its transaction has committed. Live watchers are fed from memory right after
// the commit, still under the mutex; a watcher that starts in the past
// replays the events table up to the version at which it was registered and
// then continues with the live events it was given since, so it sees no gap
// and no duplicate.
//
// The log is bounded (WithEventRetention, 10,000 events by default): older
// events are pruned in batches, and a watch from before the oldest kept
// event fails with errdefs.ErrExpired. A watcher whose consumer falls more
// than WithWatchBuffer events behind is ended the same way, so a slow
// consumer never holds up writers or other watchers.
//
// Durability: the database runs in WAL mode with synchronous=NORMAL. A
// commit has reached the operating system when a write returns, so it
// survives a crash or kill -9 of the process (the test suite kills a writer
// mid-stream to check this); only a power loss or kernel crash can lose the
// last commits before a checkpoint, never corrupt the file. WithFullSync
// trades write latency for surviving power loss too. The store is meant for
// one process: Open takes an exclusive lock on the data directory.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // the database/sql driver "sqlite"

	"stoke.dev/stoke/api/stoke/v1alpha1"
	"stoke.dev/stoke/internal/bounds"
	"stoke.dev/stoke/internal/errdefs"
	"stoke.dev/stoke/internal/store"
)

// FileName is the database file inside the data directory.
const FileName = "stoke.db"

// schemaVersion is PRAGMA user_version of a database this code can use.
const schemaVersion = 1

// maxObjectBytes bounds one stored object, like the Kubernetes API server's
// request limit for etcd: whatever the API takes (bounds.ObjectBody) is
// storable with its status at every bound.
const maxObjectBytes = bounds.StoredObject

// ddl creates the tables. objects' primary key is its identity; the
// phase index serves the scheduler's and reaper's "Runs in these phases".
var ddl = []string{
	`CREATE TABLE objects (
		kind             TEXT    NOT NULL,
		namespace        TEXT    NOT NULL,
		name             TEXT    NOT NULL,
		uid              TEXT    NOT NULL,
		resource_version INTEGER NOT NULL,
		phase            TEXT    NOT NULL DEFAULT '',
		body             BLOB    NOT NULL,
		PRIMARY KEY (kind, namespace, name)
	)`,
	`CREATE INDEX objects_by_phase ON objects (kind, phase)`,
	`CREATE TABLE events (
		rv        INTEGER PRIMARY KEY,
		kind      TEXT NOT NULL,
		type      TEXT NOT NULL,
		namespace TEXT NOT NULL,
		name      TEXT NOT NULL,
		body      BLOB NOT NULL
	)`,
	// Version 1 marks the database's creation, with a row no kind
	// matches, so that no List ever reports version "0", which Watch reads
	// as "from now": an informer that lists an empty store and then
	// watches must not miss the writes in between.
	`INSERT INTO events (rv, kind, type, namespace, name, body) VALUES (1, '', 'CREATED', '', '', x'')`,
	fmt.Sprintf(`PRAGMA user_version = %d`, schemaVersion),
}

// Option configures Open.
type Option func(*options)

type options struct {
	retention   int64
	watchBuffer int
	fullSync    bool
	now         func() time.Time
}

// WithEventRetention sets how many events the log keeps for Watch, at least
// n and at most n + n/16 (pruning runs in batches). Values below 16 are
// raised to 16.
func WithEventRetention(n int) Option {
	return func(o *options) { o.retention = int64(max(n, 16)) }
}

// WithWatchBuffer sets how many events a watcher may fall behind before its
// watch ends with errdefs.ErrExpired. Values below 1 are raised to 1.
func WithWatchBuffer(n int) Option {
	return func(o *options) { o.watchBuffer = max(n, 1) }
}

// WithFullSync makes every commit wait for fsync (synchronous=FULL), so
// that commits also survive power loss, at the price of write latency.
func WithFullSync() Option {
	return func(o *options) { o.fullSync = true }
}

// WithClock sets the clock used for creationTimestamp and
// deletionTimestamp.
func WithClock(now func() time.Time) Option {
	return func(o *options) { o.now = now }
}

// Store is a store.Store over SQLite. It is safe for concurrent use.
type Store struct {
	c        *core
	runs     *resource[*v1alpha1.Run]
	runtimes *resource[*v1alpha1.Runtime]
	fns      *resource[*v1alpha1.Function]
	wfruns   *resource[*v1alpha1.WorkflowRun]
	wfs      *resource[*v1alpha1.Workflow]
}

var _ store.Store = (*Store)(nil)

// core is what both kinds share: the connections, the write lock and the
// log's bounds.
type core struct {
	opts options
	path string
	lock *os.File // holds the data directory's flock

	w *sql.DB // one connection: every write goes through it
	r *sql.DB // readers; WAL lets them run beside the writer

	// Prepared on w.
	selectObject, insertObject, updateObject, deleteObject, insertEvent, pruneEvents *sql.Stmt
	// Prepared on r.
	getObject, replayEvents *sql.Stmt

	closedFlag atomic.Bool // read without mu by readers

	qmu     sync.Mutex // guards queue and leading (group commit, batch.go)
	queue   []*writeOp // writes waiting for the next batch
	leading bool       // a write is leading a batch

	mu         sync.Mutex // serialises batches of writes; guards the fields below and each kind's watchers and write cache
	rv         int64      // resourceVersion of the last commit
	oldest     int64      // lowest rv left in events; rv+1 when the log is empty
	sincePrune int64
	closed     bool

	kinds []kindState    // one per kind, for Close and resync
	wg    sync.WaitGroup // watcher goroutines
}

// kindState is what core may do to one kind's in-memory state; the caller
// holds mu.
type kindState interface {
	// endWatchers ends every watch quietly (the store is closing).
	endWatchers()
	// expireWatchers ends every watch with an Error event carrying err.
	expireWatchers(err error)
	// resetCache forgets the write cache.
	resetCache()
}

// Open opens, creating it when needed, the store in dir.
func Open(ctx context.Context, dir string, opts ...Option) (*Store, error) {
	o := options{retention: 10000, watchBuffer: 4096, now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	c := &core{opts: o, path: filepath.Join(dir, FileName), lock: lock}
	if err := c.open(ctx); err != nil {
		c.release()
		return nil, fmt.Errorf("open store %s: %w", c.path, err)
	}
	return &Store{
		c:        c,
		runs:     newResource(c, runKind),
		runtimes: newResource(c, runtimeKind),
		fns:      newResource(c, functionKind),
		wfruns:   newResource(c, workflowRunKind),
		wfs:      newResource(c, workflowKind),
	}, nil
}

// dsn builds a connection string; the pragmas run on every new connection.
func (c *core) dsn(writer bool) string {
	q := url.Values{}
	q.Set("_busy_timeout", "5000")
	if c.opts.fullSync {
		q.Set("_synchronous", "FULL")
	} else {
		q.Set("_synchronous", "NORMAL")
	}
	if writer {
		q.Set("_journal_mode", "WAL")
		// Writes are serialised by core.mu; IMMEDIATE makes a second
		// process fail fast at BEGIN instead of mid-transaction.
		q.Set("_txlock", "immediate")
	} else {
		q.Set("_query_only", "1")
	}
	u := url.URL{Scheme: "file", Path: c.path, RawQuery: q.Encode()}
	return u.String()
}

func (c *core) open(ctx context.Context) error {
	var err error
	if c.w, err = sql.Open("sqlite", c.dsn(true)); err != nil {
		return err
	}
	c.w.SetMaxOpenConns(1)
	c.w.SetMaxIdleConns(1)
	c.w.SetConnMaxLifetime(0)
	c.w.SetConnMaxIdleTime(0)
	if err := c.migrate(ctx); err != nil {
		return err
	}
	if c.r, err = sql.Open("sqlite", c.dsn(false)); err != nil {
		return err
	}
	c.r.SetMaxOpenConns(4)
	c.r.SetMaxIdleConns(4)
	c.r.SetConnMaxLifetime(0)
	c.r.SetConnMaxIdleTime(0)

	prepare := func(db *sql.DB, dst **sql.Stmt, query string) {
		if err == nil {
			*dst, err = db.PrepareContext(ctx, query)
		}
	}
	prepare(c.w, &c.selectObject, `SELECT resource_version, body FROM objects WHERE kind = ? AND namespace = ? AND name = ?`)
	prepare(c.w, &c.insertObject, `INSERT INTO objects (kind, namespace, name, uid, resource_version, phase, body) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`)
	prepare(c.w, &c.updateObject, `UPDATE objects SET resource_version = ?, phase = ?, body = ? WHERE kind = ? AND namespace = ? AND name = ?`)
	prepare(c.w, &c.deleteObject, `DELETE FROM objects WHERE kind = ? AND namespace = ? AND name = ?`)
	prepare(c.w, &c.insertEvent, `INSERT INTO events (rv, kind, type, namespace, name, body) VALUES (?, ?, ?, ?, ?, ?)`)
	prepare(c.w, &c.pruneEvents, `DELETE FROM events WHERE rv < ?`)
	prepare(c.r, &c.getObject, `SELECT resource_version, body FROM objects WHERE kind = ? AND namespace = ? AND name = ?`)
	prepare(c.r, &c.replayEvents, `SELECT rv, kind, type, namespace, body FROM events WHERE rv > ? AND rv <= ? ORDER BY rv LIMIT ?`)
	if err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	return c.loadCounters(ctx)
}

// migrate creates the schema in a new database and refuses one written by
// a newer Stoke.
func (c *core) migrate(ctx context.Context) error {
	var version int
	if err := c.w.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&version); err != nil {
		return err
	}
	switch {
	case version == schemaVersion:
		return nil
	case version > schemaVersion:
		return fmt.Errorf("schema version %d is newer than this program's %d: %w", version, schemaVersion, errdefs.ErrFailedPrecondition)
	}
	tx, err := c.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	for _, stmt := range ddl {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("create schema: %w", err)
		}
	}
	return tx.Commit()
}

// loadCounters reads the last resourceVersion and the log's lower bound.
// The counter is the largest version anywhere, so it never goes back even
// if the log were empty.
func (c *core) loadCounters(ctx context.Context) error {
	var maxEvent, maxObject, minEvent sql.NullInt64
	row := c.w.QueryRowContext(ctx, `SELECT (SELECT MAX(rv) FROM events), (SELECT MIN(rv) FROM events), (SELECT MAX(resource_version) FROM objects)`)
	if err := row.Scan(&maxEvent, &minEvent, &maxObject); err != nil {
		return fmt.Errorf("read resource version: %w", err)
	}
	c.rv = max(maxEvent.Int64, maxObject.Int64)
	c.oldest = c.rv + 1
	if minEvent.Valid {
		c.oldest = minEvent.Int64
	}
	return nil
}

// Runs returns the Run resource.
func (s *Store) Runs() store.Resource[*v1alpha1.Run] { return s.runs }

// Runtimes returns the Runtime resource.
func (s *Store) Runtimes() store.Resource[*v1alpha1.Runtime] { return s.runtimes }

// Functions returns the Function resource.
func (s *Store) Functions() store.Resource[*v1alpha1.Function] { return s.fns }

// WorkflowRuns returns the WorkflowRun resource.
func (s *Store) WorkflowRuns() store.Resource[*v1alpha1.WorkflowRun] { return s.wfruns }

// Workflows returns the Workflow resource.
func (s *Store) Workflows() store.Resource[*v1alpha1.Workflow] { return s.wfs }

// Close ends every watch, waits for the watch goroutines and closes the
// database. It is safe to call more than once.
func (s *Store) Close() error {
	c := s.c
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.closedFlag.Store(true)
	for _, k := range c.kinds {
		k.endWatchers()
	}
	c.mu.Unlock()
	c.wg.Wait()
	return c.release()
}

// release closes what open opened, in reverse order.
func (c *core) release() error {
	var errs []error
	for _, st := range []*sql.Stmt{c.selectObject, c.insertObject, c.updateObject, c.deleteObject, c.insertEvent, c.pruneEvents, c.getObject, c.replayEvents} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	if c.r != nil {
		errs = append(errs, c.r.Close())
	}
	if c.w != nil {
		errs = append(errs, c.w.Close())
	}
	if c.lock != nil {
		errs = append(errs, c.lock.Close()) // closing the file drops the flock
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close store %s: %w", c.path, err)
	}
	return nil
}

// errClosed is what calls on a closed store return.
func errClosed() error {
	return fmt.Errorf("store is closed: %w", errdefs.ErrUnavailable)
}

// readErr is err from a read, or the closed-store error when the store was
// closed under the read.
func (c *core) readErr(err error) error {
	if c.closedFlag.Load() {
		return errClosed()
	}
	return err
}

// appendEvent records a write in the log.
func (c *core) appendEvent(ctx context.Context, tx *sql.Tx, rv int64, kind string, typ store.EventType, namespace, name string, body []byte) error {
	_, err := tx.StmtContext(ctx, c.insertEvent).ExecContext(ctx, rv, kind, string(typ), namespace, name, body)
	return err
}

// commit prunes the log when a batch is due and commits the n writes
// whose last produced rv; the caller holds mu.
func (c *core) commit(ctx context.Context, tx *sql.Tx, rv, n int64) error {
	// Prune every retention/16 writes, so that the log holds between
	// retention and retention*17/16 events and the delete is amortised.
	pruneTo := int64(0)
	if c.sincePrune+n >= max(c.opts.retention/16, 1) && rv-c.opts.retention+1 > c.oldest {
		pruneTo = rv - c.opts.retention + 1
		if _, err := tx.StmtContext(ctx, c.pruneEvents).ExecContext(ctx, pruneTo); err != nil {
			return fmt.Errorf("prune events: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return c.resync(fmt.Errorf("commit: %w", err))
	}
	c.rv = rv
	c.sincePrune += n
	if pruneTo > 0 {
		c.oldest = pruneTo
		c.sincePrune = 0
	}
	return nil
}

// resync re-reads the counters after a failed commit. The driver rolls a
// failed COMMIT back, so the counter should not have moved; if it did, a
// write committed without its watchers hearing of it, and every watcher is
// ended so that it re-lists rather than miss an event.
func (c *core) resync(cause error) error {
	before := c.rv
	if err := c.loadCounters(context.Background()); err != nil {
		return errors.Join(cause, err)
	}
	if c.rv != before {
		for _, k := range c.kinds {
			k.resetCache()
			k.expireWatchers(fmt.Errorf("a write committed without being delivered: %w", errdefs.ErrExpired))
		}
	}
	return cause
}
