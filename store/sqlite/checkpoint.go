package sqlite

import (
	"context"
	"database/sql"
	"log/slog"
	"time"

	"github.com/jonboulle/clockwork"
)

// checkpointer copies the pages of the write-ahead log back into the
// database file from a goroutine and a connection of its own, so that no
// COMMIT of the writer waits for a checkpoint (SQLite's automatic one runs
// inside the COMMIT that crosses its threshold, and every transaction of
// that batch waits for it). It runs a PASSIVE checkpoint, which never
// blocks the writer or a reader, after a commit, at most once an interval.
//
// The writer keeps SQLite's automatic checkpoint at Options.MaxWALPages:
// a log is started again from its beginning only after a checkpoint that
// copied all of it, which under a steady stream of commits the background
// one seldom manages between two of them (it copies, and chases, what the
// log held when it began). The writer's checkpoint then has little left
// to copy.
type checkpointer struct {
	conn  *sql.Conn
	clock clockwork.Clock
	every time.Duration
	stats *counters
	log   *slog.Logger

	failing int // consecutive failed checkpoints; only the loop touches it

	kick   chan struct{} // capacity 1: a commit since the last checkpoint
	stop   chan struct{} // closed by Close
	exited chan struct{} // closed when loop returned

	ran    func(logPages, moved int, err error) // test hook: called after each checkpoint
	inject func() error                         // test hook: a non-nil error replaces the checkpoint
}

func newCheckpointer(conn *sql.Conn, clock clockwork.Clock, every time.Duration, stats *counters, log *slog.Logger) *checkpointer {
	return &checkpointer{conn: conn, clock: clock, every: every, stats: stats, log: log,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), exited: make(chan struct{})}
}

// committed tells the checkpointer that the log grew; it never blocks.
func (c *checkpointer) committed() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// loop checkpoints after each commit, then waits out the interval.
func (c *checkpointer) loop() {
	defer close(c.exited)
	for {
		select {
		case <-c.stop:
			return
		case <-c.kick:
		}
		// A pass copies the log as it was when it began; commits during it
		// leave it incomplete, and an incomplete log is never started
		// again from its beginning (it would grow to the backstop). Each
		// following pass has less to copy, since copying is faster than
		// writing: chase it a few times, then wait out the interval.
		for range maxChase {
			if c.run() {
				break
			}
		}
		select {
		case <-c.stop:
			return
		case <-c.clock.After(c.every):
		}
	}
}

// maxChase bounds the passes of one checkpoint round.
const maxChase = 4

// run runs one PASSIVE checkpoint. An error (an I/O error; a checkpoint
// that another one holds up reports busy, not an error) is counted and
// left to the next one or to the writer's backstop: a checkpoint only
// moves pages that are already durable in the log. The first failure
// after a success is logged, and so is the first success after failures,
// so that a failing disk is neither silent nor a flood.
//
// It reports whether the log was copied whole, so that the next write
// starts it from the beginning (an error counts as whole: nothing to
// chase).
func (c *checkpointer) run() (whole bool) {
	var busy, logPages, moved int
	var err error
	if c.inject != nil {
		err = c.inject()
	}
	if err == nil {
		err = c.conn.QueryRowContext(context.Background(), "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &logPages, &moved)
	}
	if err != nil {
		c.stats.checkpointErrors.Add(1)
		if c.failing == 0 {
			c.log.Error("sqlite: background checkpoint failed; the write-ahead log grows until one works", "err", err)
		}
		c.failing++
	} else {
		c.stats.checkpoints.Add(1)
		if c.failing > 0 {
			c.log.Info("sqlite: background checkpoints work again", "failed", c.failing)
		}
		c.failing = 0
	}
	if c.ran != nil {
		c.ran(logPages, moved, err)
	}
	return err != nil || moved >= logPages
}

// close stops the loop and closes its connection.
func (c *checkpointer) close() {
	close(c.stop)
	<-c.exited
	c.conn.Close()
}
