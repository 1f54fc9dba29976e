// Package sqlite implements store.DB on SQLite through the pure-Go driver
// modernc.org/sqlite: one database file in WAL mode with synchronous=NORMAL,
// a single writer connection (so writers queue in Go rather than spin on
// SQLITE_BUSY) and a small pool of readers.
//
// # Prepared statements
//
// Every connection keeps its prepared statements, up to
// Options.StatementCache of them, least recently used out first, so a
// statement is parsed once per connection rather than on every call.
// Statements run with a context that cannot be cancelled, so the driver
// starts no goroutine to watch one.
//
// # Group commit
//
// Update transactions queue for the writer. A committer goroutine gives
// the writer to each in turn — the callback runs on its caller's goroutine —
// and puts the ones queued by the time the one before ends into the same
// SQLite transaction, each after the first inside a SAVEPOINT of its own:
// BEGIN IMMEDIATE, fn₁, SAVEPOINT, fn₂, RELEASE, …, COMMIT. A callback that
// fails (or panics) is rolled back to its savepoint and the others go on.
// Every Update returns only after the COMMIT that holds its writes returned,
// so nothing reports durable state early; a failing COMMIT fails each
// transaction of its batch. A batch is bounded by Options.MaxBatch
// transactions, MaxBatchBytes bytes of statement arguments and MaxBatchTime
// from its BEGIN; it never waits for transactions to come, so a lone
// Update costs what it did without grouping. An Update whose context is
// marked store.WithUrgent (a person waits on it) is taken before the
// ordinary ones queued: it starts the next batch, or joins the open one as
// its next member, instead of waiting behind every stream's chunks, and a
// batch that holds one takes no more ordinary ones. They are not starved:
// after a batch an urgent transaction started, the oldest ordinary one
// starts the next.
//
// # Checkpoints
//
// A goroutine with a connection of its own copies the write-ahead log back
// into the database file (a PASSIVE checkpoint, which blocks neither the
// writer nor the readers) after commits, at most once every
// Options.CheckpointInterval, so a COMMIT seldom waits for one. The
// COMMIT that makes the log Options.MaxWALPages long still checkpoints
// itself, as SQLite does by default at 1,000 pages, so that the log is
// started again from its beginning and stays bounded; it finds most pages
// copied already.
//
// # What cancels what
//
//   - The context given to Update or View ends the wait for the writer or a
//     reader: a transaction whose callback has not started returns the
//     context's error and writes nothing.
//   - The context given to a statement (Tx.Exec, Query, QueryRow) is checked
//     before the statement starts: a done context fails it, so a callback
//     that goes on after its context ended fails and is rolled back whole.
//     A statement that has started is never interrupted (interrupting one
//     would roll back the whole SQLite transaction, and with it the other
//     transactions of its batch).
//   - Once the callback returned nil, the commit is not cancellable: Update
//     waits for it and reports its real outcome, never "cancelled" for a
//     transaction that may have committed.
//
// # Full or read-only disk
//
// A write the disk refuses (SQLITE_FULL, SQLITE_READONLY, SQLITE_IOERR: a
// full disk, a database made read-only under the process, a failing disk)
// rolls its transaction back whole, SQLite's own guarantee, and Update runs
// it again once the disk takes writes (backoff from 10 ms to one second):
// nothing of it is half-written, and a turn or run in flight goes on once
// space is back, without a restart. It gives up with an error wrapping
// store.ErrUnavailable when its context ends, when the context's
// store.WithRetryLimit passes (the server sets one while it loads a
// request's agent, which then gets 503), or after Options.MaxOutage (two
// minutes). Reads (View) are not affected; background checkpoints fail and
// are logged until the disk takes writes again.
//
// # Callbacks that wait
//
// An Update callback holds the writer, and with group commit the
// transactions before it in its batch wait for it too. A callback must not
// call Update itself, nor wait for something that waits for the writer. If
// one does, the stall watchdog ends the deadlock: a callback that made no
// call on its connection for Options.StallTimeout while others waited is
// rolled back, its later statements fail, and its Update returns
// ErrStalled; the others go on.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	sqlitedrv "modernc.org/sqlite" // registers the "sqlite" driver
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/agentry/agentry/store"
)

// Options tune Open. The zero value gives the defaults.
type Options struct {
	// MaxBatch bounds the Update transactions that share one commit
	// (default 64).
	MaxBatch int
	// MaxBatchBytes bounds the bytes of string and blob arguments, summed
	// over the statements of one batch, after which it commits (default 4 MiB).
	MaxBatchBytes int
	// MaxBatchTime bounds how long a batch takes new transactions in, from
	// its BEGIN (default 20 ms).
	MaxBatchTime time.Duration
	// StallTimeout is how long a write callback may sit idle while others
	// wait before it is rolled back with ErrStalled (default 10 s, long
	// enough that a callback starved of CPU on a loaded machine is not
	// mistaken for a deadlock; negative:
	// never).
	StallTimeout time.Duration
	// StatementCache is the number of prepared statements kept per
	// connection (default 256; negative: none).
	StatementCache int
	// Readers is the number of reader connections (default GOMAXPROCS, at
	// least 2).
	Readers int
	// CheckpointInterval is the least time between two background
	// checkpoints, which copy the write-ahead log's pages into the
	// database file off the writer's path (default 100 ms; negative: no
	// background checkpoints, SQLite checkpoints inside the COMMIT that
	// makes the log 1,000 pages long, its own default).
	CheckpointInterval time.Duration
	// MaxWALPages bounds the write-ahead log: a COMMIT that makes the log
	// this many pages long checkpoints itself (default 2,000 pages, 8 MB
	// of 4 KiB pages). Under a steady stream of commits the background
	// checkpoints rarely copy the whole log between two of them, and only
	// a whole copy lets the next write start the log from its beginning;
	// the writer's own checkpoint does, and finds most pages copied.
	MaxWALPages int
	// Clock times the batches, the stall watchdog and the background
	// checkpoints (default: the real clock).
	Clock clockwork.Clock
	// Logger receives the background checkpoints' failures (an I/O error:
	// the disk is failing or full), once when they start failing and once
	// when they work again; nil means slog.Default().
	Logger *slog.Logger
	// MaxOutage is the longest an Update waits for a disk that refuses its
	// writes (full, read-only, failing; see "Full or read-only disk" in
	// the package comment) when its context carries no shorter
	// store.WithRetryLimit (default 2 minutes).
	MaxOutage time.Duration
}

func (o Options) withDefaults() Options {
	if o.MaxBatch <= 0 {
		o.MaxBatch = 64
	}
	if o.MaxOutage <= 0 {
		o.MaxOutage = 2 * time.Minute
	}
	if o.MaxBatchBytes <= 0 {
		o.MaxBatchBytes = 4 << 20
	}
	if o.MaxBatchTime <= 0 {
		o.MaxBatchTime = 20 * time.Millisecond
	}
	if o.StallTimeout == 0 {
		o.StallTimeout = 10 * time.Second
	}
	if o.StatementCache == 0 {
		o.StatementCache = 256
	}
	if o.Readers <= 0 {
		o.Readers = max(2, runtime.GOMAXPROCS(0))
	}
	if o.CheckpointInterval == 0 {
		o.CheckpointInterval = 100 * time.Millisecond
	}
	if o.MaxWALPages <= 0 {
		o.MaxWALPages = 2000
	}
	if o.Clock == nil {
		o.Clock = clockwork.NewRealClock()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// DB is a store.DB backed by one SQLite file.
type DB struct {
	writer *sql.DB
	reader *sql.DB
	path   string
	w      *writer
	ckpt   *checkpointer // nil without background checkpoints
	ckptDB *sql.DB       // the checkpointer's connection pool (of one)
	stats  counters

	closeOnce sync.Once
	closeErr  error
	maxOutage time.Duration
}

var _ store.DB = (*DB)(nil)

// Stats counts what a DB did since Open, for benchmarks.
type Stats struct {
	// Updates is the number of Update callbacks that ran.
	Updates int64
	// Committed is the number of Update transactions committed.
	Committed int64
	// Commits is the number of SQLite COMMITs of the writer: one per batch.
	Commits int64
	// Views is the number of View transactions.
	Views int64
	// Statements is the number of statements the callbacks ran (Exec,
	// Query, QueryRow), without BEGIN, SAVEPOINT and COMMIT.
	Statements int64
	// Prepares is the number of statements prepared (parsed): the misses
	// of the statement caches.
	Prepares int64
	// Stalled is the number of transactions the stall watchdog rolled back.
	Stalled int64
	// Checkpoints is the number of background checkpoints run, and
	// CheckpointErrors the number that failed (left to the next one).
	Checkpoints, CheckpointErrors int64
	// DiskRefused is the number of Update attempts that failed because
	// the disk refused the write (full, read-only, failing), and were
	// retried or given up.
	DiskRefused int64
}

type counters struct {
	updates, committed, commits, views, statements, prepares, stalled atomic.Int64
	checkpoints, checkpointErrors, diskRefused                        atomic.Int64
}

// Stats returns the counters.
func (db *DB) Stats() Stats {
	s := &db.stats
	return Stats{Updates: s.updates.Load(), Committed: s.committed.Load(), Commits: s.commits.Load(),
		Views: s.views.Load(), Statements: s.statements.Load(), Prepares: s.prepares.Load(),
		Stalled: s.stalled.Load(), Checkpoints: s.checkpoints.Load(), CheckpointErrors: s.checkpointErrors.Load(),
		DiskRefused: s.diskRefused.Load()}
}

// Open opens (creating if needed) the database at path with the default
// Options. A path of ":memory:" is not supported, since readers and the
// writer must share one database; use a file in a temporary folder instead.
func Open(ctx context.Context, path string) (*DB, error) {
	return OpenOptions(ctx, path, Options{})
}

// OpenOptions is Open with options.
func OpenOptions(ctx context.Context, path string, opts Options) (*DB, error) {
	opts = opts.withDefaults()
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("sqlite: create data folder: %w", err)
		}
	}
	pragmas := url.Values{}
	for _, p := range []string{
		"journal_mode(WAL)",
		"synchronous(NORMAL)",
		"busy_timeout(10000)",
		"foreign_keys(ON)",
		"temp_store(MEMORY)",
	} {
		pragmas.Add("_pragma", p)
	}
	readerDSN := "file:" + path + "?" + pragmas.Encode() + "&mode=ro"
	autoCheckpoint := opts.MaxWALPages
	if opts.CheckpointInterval < 0 {
		autoCheckpoint = 1000
	}
	pragmas.Add("_pragma", fmt.Sprintf("wal_autocheckpoint(%d)", autoCheckpoint))
	writerDSN := "file:" + path + "?" + pragmas.Encode()

	db := &DB{path: path, maxOutage: opts.MaxOutage}
	// The driver modernc.org/sqlite registered (with its package-level
	// functions and hooks); sql.Open connects nothing.
	reg, err := sql.Open("sqlite", "")
	if err != nil {
		return nil, fmt.Errorf("sqlite: driver: %w", err)
	}
	drv := reg.Driver()
	reg.Close()
	db.writer = sql.OpenDB(&connector{dsn: writerDSN, drv: drv, cache: opts.StatementCache, stats: &db.stats})
	db.writer.SetMaxOpenConns(1)
	db.writer.SetMaxIdleConns(1)
	db.writer.SetConnMaxLifetime(0)
	conn, err := db.writer.Conn(ctx)
	if err == nil {
		err = conn.PingContext(ctx)
	}
	if err != nil {
		if conn != nil {
			conn.Close()
		}
		db.writer.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	var cc *cachingConn
	conn.Raw(func(dc any) error { cc = dc.(*cachingConn); return nil })
	db.reader = sql.OpenDB(&connector{dsn: readerDSN, drv: drv, cache: opts.StatementCache, stats: &db.stats})
	db.reader.SetMaxOpenConns(opts.Readers)
	db.reader.SetMaxIdleConns(opts.Readers)
	db.reader.SetConnMaxLifetime(0)
	db.w = &writer{db: db, conn: conn, cc: cc, queue: make(chan *writeTx, 4096), urgent: make(chan *writeTx, 4096),
		stop: make(chan struct{}), exited: make(chan struct{}),
		clock: opts.Clock, maxBatch: opts.MaxBatch, maxBytes: opts.MaxBatchBytes,
		maxTime: opts.MaxBatchTime, stall: opts.StallTimeout}
	if opts.CheckpointInterval > 0 {
		// Its own connection on the writer's settings (not read-only: a
		// checkpoint writes the database file).
		cdb := sql.OpenDB(&connector{dsn: writerDSN, drv: drv, cache: -1, stats: &counters{}})
		cconn, err := cdb.Conn(ctx)
		if err != nil {
			cdb.Close()
			db.reader.Close()
			conn.Close()
			db.writer.Close()
			return nil, fmt.Errorf("sqlite: open %s for checkpoints: %w", path, err)
		}
		db.ckptDB = cdb
		db.ckpt = newCheckpointer(cconn, opts.Clock, opts.CheckpointInterval, &db.stats, opts.Logger)
		db.w.ckpt = db.ckpt
		go db.ckpt.loop()
	}
	go db.w.loop()
	return db, nil
}

// Path returns the database file's path.
func (db *DB) Path() string { return db.path }

// Dialect returns "sqlite".
func (db *DB) Dialect() string { return "sqlite" }

// Update runs fn in a write transaction, grouped with the Update
// transactions queued at the same moment into one SQLite commit (see the
// package comment), and returns once that commit returned: nil when fn's
// writes are durable, fn's error when fn failed (its writes rolled back).
func (db *DB) Update(ctx context.Context, fn func(store.Tx) error) error {
	fn = store.Fenced(ctx, fn)
	var start time.Time
	for n := 0; ; n++ {
		err := db.w.update(ctx, fn)
		if err == nil || !diskRefused(err) {
			return err
		}
		// The transaction was rolled back whole (SQLite undoes a
		// transaction whose COMMIT failed): running it again is safe.
		db.stats.diskRefused.Add(1)
		now := time.Now()
		if start.IsZero() {
			start = now
		}
		limit := db.maxOutage
		if d, ok := store.RetryLimitOf(ctx); ok && d < limit {
			limit = d
		}
		left := limit - now.Sub(start)
		if left <= 0 {
			return fmt.Errorf("sqlite: %w: the disk refused writes for %v: %w", store.ErrUnavailable, now.Sub(start).Round(time.Millisecond), err)
		}
		t := time.NewTimer(min(10*time.Millisecond<<min(n, 7), time.Second, left))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("sqlite: %w: %w (%w)", store.ErrUnavailable, err, context.Cause(ctx))
		case <-db.w.stop:
			t.Stop()
			return ErrClosed
		}
	}
}

// diskRefused reports an error of a write the disk refused: full
// (SQLITE_FULL), read-only (SQLITE_READONLY, a file or folder made
// read-only under the database) or failing (SQLITE_IOERR, as a write past
// the file size limit gives).
func diskRefused(err error) bool {
	var se *sqlitedrv.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY:
		return true
	}
	return false
}

// View runs fn in a read-only transaction on a reader connection.
func (db *DB) View(ctx context.Context, fn func(store.Tx) error) (err error) {
	conn, err := db.reader.Conn(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("sqlite: reader: %w", err)
	}
	defer conn.Close()
	bg := context.Background()
	if _, err := conn.ExecContext(bg, "BEGIN"); err != nil {
		return fmt.Errorf("sqlite: begin: %w", err)
	}
	db.stats.views.Add(1)
	t := &tx{db: db, conn: conn}
	defer func() {
		t.closeRows()
		if p := recover(); p != nil {
			conn.ExecContext(bg, "ROLLBACK")
			panic(p)
		}
	}()
	if err := fn(t); err != nil {
		t.closeRows()
		conn.ExecContext(bg, "ROLLBACK")
		return err
	}
	t.closeRows()
	if _, err := conn.ExecContext(bg, "COMMIT"); err != nil {
		conn.ExecContext(bg, "ROLLBACK")
		return fmt.Errorf("sqlite: end read transaction: %w", err)
	}
	return nil
}

// Close waits for the write transaction in progress, fails the queued ones
// with ErrClosed, and closes every connection.
func (db *DB) Close() error {
	db.closeOnce.Do(func() {
		close(db.w.stop)
		<-db.w.exited
		if db.ckpt != nil {
			db.ckpt.close()
			db.ckptDB.Close()
		}
		db.w.conn.Close()
		rerr := db.reader.Close()
		werr := db.writer.Close()
		if werr != nil {
			db.closeErr = fmt.Errorf("sqlite: close: %w", werr)
		} else if rerr != nil {
			db.closeErr = fmt.Errorf("sqlite: close: %w", rerr)
		}
	})
	return db.closeErr
}

// tx is the store.Tx of a View or an Update callback.
type tx struct {
	db    *DB
	conn  *sql.Conn
	write bool

	mu      sync.Mutex // held by each statement, and by the stall watchdog's abort
	aborted bool       // the watchdog rolled this transaction back
	rows    []*sql.Rows
	bytes   int // of string and blob arguments
}

// begin checks that a statement may start; the caller holds t.mu.
func (t *tx) begin(ctx context.Context, args []any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if t.aborted {
		return ErrStalled
	}
	t.db.stats.statements.Add(1)
	if t.write {
		for _, a := range args {
			switch v := a.(type) {
			case string:
				t.bytes += len(v)
			case []byte:
				t.bytes += len(v)
			default:
				t.bytes += 8
			}
		}
	}
	return nil
}

func (t *tx) Exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	q = stripLocking(q)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.begin(ctx, args); err != nil {
		return nil, err
	}
	return t.conn.ExecContext(context.Background(), q, args...)
}

func (t *tx) Query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	q = stripLocking(q)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.begin(ctx, args); err != nil {
		return nil, err
	}
	rows, err := t.conn.QueryContext(context.Background(), q, args...)
	if err == nil {
		t.rows = append(t.rows, rows)
	}
	return rows, err
}

func (t *tx) QueryRow(ctx context.Context, q string, args ...any) *sql.Row {
	q = stripLocking(q)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.begin(ctx, args); err != nil {
		// A *sql.Row can only be made by database/sql: a context that is
		// already done carries err to its Scan.
		return t.conn.QueryRowContext(failedContext{err}, q)
	}
	return t.conn.QueryRowContext(context.Background(), q, args...)
}

// closeRows closes the rows the callback left open.
func (t *tx) closeRows() {
	t.mu.Lock()
	rows := t.rows
	t.rows = nil
	t.mu.Unlock()
	for _, r := range rows {
		r.Close()
	}
}

// abort marks t rolled back by the watchdog and closes its open rows, if
// idle (checked under t.mu, so no statement of t is running) still holds.
func (t *tx) abort(idle func() bool) bool {
	t.mu.Lock()
	if !idle() {
		t.mu.Unlock()
		return false
	}
	t.aborted = true
	rows := t.rows
	t.rows = nil
	t.mu.Unlock()
	for _, r := range rows {
		r.Close()
	}
	return true
}

// stripLocking removes a trailing row-locking clause (FOR UPDATE, FOR
// SHARE, optionally NOWAIT or SKIP LOCKED), which portable SQL may end a
// SELECT with: SQLite has one writer, so a write transaction holds every
// row it reads already.
func stripLocking(q string) string {
	end := strings.TrimRight(q, " \t\r\n;")
	if n := len(end); n < 6 {
		return q
	} else if tail := strings.ToUpper(end[max(0, n-6):]); tail != "UPDATE" && tail != "NOWAIT" && tail != "LOCKED" && !strings.HasSuffix(tail, "SHARE") {
		return q
	}
	if loc := lockingClause.FindStringIndex(end); loc != nil {
		return end[:loc[0]]
	}
	return q
}

var lockingClause = regexp.MustCompile(`(?is)\s+FOR\s+(?:UPDATE|SHARE|NO\s+KEY\s+UPDATE|KEY\s+SHARE)(?:\s+OF\s+[\w, ]+?)?(?:\s+(?:NOWAIT|SKIP\s+LOCKED))?$`)

// failedContext is a done context whose Err is a given error.
type failedContext struct{ err error }

func (failedContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (failedContext) Value(any) any               { return nil }
func (c failedContext) Err() error                { return c.err }

func (failedContext) Done() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}
