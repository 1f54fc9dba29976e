package sqlite

import (
	"context"
	"database/sql"
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
// The writer keeps SQLite's automatic checkpoint as a backstop at
// Options.MaxWALPages: should the checkpointer fall behind (a reader that
// holds an old snapshot, a starved goroutine), the log still stays bounded.
type checkpointer struct {
	conn  *sql.Conn
	clock clockwork.Clock
	every time.Duration
	stats *counters

	kick   chan struct{} // capacity 1: a commit since the last checkpoint
	stop   chan struct{} // closed by Close
	exited chan struct{} // closed when loop returned

	ran func(logPages, moved int, err error) // test hook: called after each checkpoint
}

func newCheckpointer(conn *sql.Conn, clock clockwork.Clock, every time.Duration, stats *counters) *checkpointer {
	return &checkpointer{conn: conn, clock: clock, every: every, stats: stats,
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
		c.run()
		select {
		case <-c.stop:
			return
		case <-c.clock.After(c.every):
		}
	}
}

// run runs one PASSIVE checkpoint. An error (SQLITE_BUSY while another
// checkpoint runs, an I/O error) is counted and left to the next one or to
// the writer's backstop: a checkpoint only moves pages that are already
// durable in the log.
func (c *checkpointer) run() {
	var busy, logPages, moved int
	err := c.conn.QueryRowContext(context.Background(), "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &logPages, &moved)
	if err != nil {
		c.stats.checkpointErrors.Add(1)
	} else {
		c.stats.checkpoints.Add(1)
	}
	if c.ran != nil {
		c.ran(logPages, moved, err)
	}
}

// close stops the loop and closes its connection.
func (c *checkpointer) close() {
	close(c.stop)
	<-c.exited
	c.conn.Close()
}
