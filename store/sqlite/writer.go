package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/store"
)

// ErrStalled is returned by Update when its callback sat idle — started no
// statement — for Options.StallTimeout while other transactions waited for
// the writer (as an Update called from inside another Update's callback
// does, or a callback that waits for a goroutine that waits for the writer).
// Its transaction was rolled back; the others went on.
var ErrStalled = errors.New("sqlite: write transaction stalled while others waited for the writer; rolled back")

// ErrClosed is returned by Update and View after Close.
var ErrClosed = errors.New("sqlite: database closed")

// The states of a queued write transaction: the committer moves it from
// queued to running when it gives it the writer; its caller moves it from
// queued to gone when its context ends first.
const (
	queued int32 = iota
	running
	gone
)

// writeTx is one Update: its callback runs on the caller's goroutine while
// the committer waits; its result comes after the batch's COMMIT.
type writeTx struct {
	tx
	state atomic.Int32
	turn  chan struct{} // closed by the committer: the callback may run, unless refused
	// refused, set before turn is closed, is why the callback must not run
	// (the batch could not begin or was lost before its turn).
	refused error
	done    chan error // the callback's outcome, from the caller (buffered)
	res     chan error // the transaction's result, from the committer (buffered)
	urgent  bool       // queued in the urgent lane (store.WithUrgent)
}

// writer is the single SQLite writer connection and its committer
// goroutine, which groups the transactions queued at one moment into one
// SQLite transaction (BEGIN IMMEDIATE … COMMIT), each after the first in a
// SAVEPOINT of its own.
type writer struct {
	db    *DB
	conn  *sql.Conn    // owned by the committer; callbacks use it in their turn
	cc    *cachingConn // the driver connection under conn
	queue chan *writeTx
	// urgent queues the transactions marked store.WithUrgent: the
	// committer takes them before those in queue.
	urgent chan *writeTx
	stop   chan struct{} // closed by Close
	exited chan struct{} // closed when the committer returned

	clock    clockwork.Clock
	maxBatch int
	maxBytes int
	maxTime  time.Duration
	stall    time.Duration
	// watchdog is the stall watchdog's timer, owned by the committer (nil
	// until its first await).
	watchdog clockwork.Timer

	ckpt *checkpointer // told of each commit; nil without background checkpoints

	enqueued func() // test hook: called after a transaction was queued
}

func (w *writer) exec(query string) error {
	_, err := w.conn.ExecContext(context.Background(), query)
	return err
}

// update is DB.Update.
func (w *writer) update(ctx context.Context, fn func(store.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t := &writeTx{tx: tx{db: w.db, conn: w.conn, write: true},
		turn: make(chan struct{}), done: make(chan error, 1), res: make(chan error, 1)}
	queue := w.queue
	if store.IsUrgent(ctx) {
		queue = w.urgent
		t.urgent = true
	}
	select {
	case queue <- t:
	case <-ctx.Done():
		return ctx.Err()
	case <-w.exited:
		return ErrClosed
	}
	if w.enqueued != nil {
		w.enqueued()
	}
	select {
	case <-t.turn:
		if t.refused != nil {
			return t.refused
		}
	case <-ctx.Done():
		if t.state.CompareAndSwap(queued, gone) {
			return ctx.Err()
		}
		<-t.turn // the committer took it at the same moment: give the turn back unused
		t.done <- ctx.Err()
		return ctx.Err()
	case <-w.exited:
		if t.state.CompareAndSwap(queued, gone) {
			return ErrClosed
		}
		<-t.turn
		t.done <- ErrClosed
		return ErrClosed
	}
	w.db.stats.updates.Add(1)
	if err := t.run(fn); err != nil {
		t.done <- err
		<-t.res
		return err
	}
	t.done <- nil
	return <-t.res
}

// run calls fn, then closes the rows it left open. A panic rolls the
// transaction back and goes on up the caller's stack.
func (t *writeTx) run(fn func(store.Tx) error) (err error) {
	defer func() {
		t.closeRows()
		if p := recover(); p != nil {
			t.done <- errors.New("sqlite: update callback panicked")
			panic(p)
		}
	}()
	return fn(&t.tx)
}

// loop is the committer. An urgent transaction starts a batch before a
// queued ordinary one, except right after a batch an urgent one started:
// then the oldest ordinary one waiting starts it (the urgent ones join it
// next), so that a stream of urgent transactions cannot starve the others.
func (w *writer) loop() {
	defer close(w.exited)
	urgentLast := false
	for {
		var t *writeTx
		if urgentLast {
			select {
			case t = <-w.queue:
			default:
			}
		}
		if t == nil {
			select {
			case <-w.stop:
				return
			case t = <-w.urgent:
			default:
				select {
				case <-w.stop:
					return
				case t = <-w.urgent:
				case t = <-w.queue:
				}
			}
		}
		urgentLast = t.urgent
		if t.state.CompareAndSwap(queued, running) {
			w.batch(t)
		}
	}
}

// next returns a queued transaction that may join the open batch, an
// urgent one first, or nil. With urgentOnly (the batch holds an urgent
// transaction, whose caller waits for its COMMIT) it returns only urgent
// ones.
func (w *writer) next(urgentOnly bool) *writeTx {
	for {
		select {
		case <-w.stop:
			return nil
		default:
		}
		var t *writeTx
		select {
		case t = <-w.urgent:
		default:
			if urgentOnly {
				return nil
			}
			select {
			case t = <-w.urgent:
			case t = <-w.queue:
			default:
				return nil
			}
		}
		if t.state.CompareAndSwap(queued, running) {
			return t
		}
	}
}

// batch runs first and every transaction that is queued by the time the one
// before it ends, within the bounds, in one SQLite transaction, and hands
// each its result once the COMMIT returned. Once an urgent transaction is
// in, only urgent ones join: its COMMIT does not wait for a batch's worth
// of ordinary ones (they go in the next batch, right after). The first
// needs no savepoint: if it fails, nothing else is in the transaction yet
// and all of it is rolled back.
func (w *writer) batch(first *writeTx) {
	if err := w.exec("BEGIN IMMEDIATE"); err != nil {
		first.refuse(fmt.Errorf("sqlite: begin: %w", err))
		return
	}
	start := w.clock.Now()
	var members []*writeTx
	bytes := 0
	urgent := false
	for t := first; t != nil; t = w.next(urgent) {
		urgent = urgent || t.urgent
		savepoint := len(members) > 0
		if savepoint {
			if err := w.exec("SAVEPOINT g"); err != nil {
				w.abandon(members, t, fmt.Errorf("sqlite: savepoint: %w", err))
				return
			}
		}
		err := w.await(t, members)
		switch {
		case err == nil:
			if savepoint {
				if err := w.exec("RELEASE g"); err != nil {
					w.abandon(append(members, t), nil, fmt.Errorf("sqlite: release savepoint: %w", err))
					return
				}
			}
			members = append(members, t)
			bytes += t.bytes
		case savepoint:
			// Undo this one alone. If that fails, SQLite may have rolled back
			// the whole transaction (some I/O errors do): none of the batch
			// is committed, and each member learns it.
			if rerr := w.exec("ROLLBACK TO g"); rerr != nil {
				t.res <- err
				w.abandon(members, nil, fmt.Errorf("sqlite: batch lost after a failed transaction: %w", rerr))
				return
			}
			if rerr := w.exec("RELEASE g"); rerr != nil {
				t.res <- err
				w.abandon(members, nil, fmt.Errorf("sqlite: release savepoint: %w", rerr))
				return
			}
			t.res <- err
		default:
			w.exec("ROLLBACK") // an error here means SQLite already rolled back
			t.res <- err
			return
		}
		if len(members) >= w.maxBatch || bytes >= w.maxBytes || w.clock.Since(start) >= w.maxTime {
			break
		}
	}
	if len(members) == 0 {
		w.exec("ROLLBACK")
		return
	}
	var err error
	if cerr := w.exec("COMMIT"); cerr != nil {
		w.exec("ROLLBACK")
		err = fmt.Errorf("sqlite: commit: %w", cerr)
	} else {
		w.db.stats.commits.Add(1)
		w.db.stats.committed.Add(int64(len(members)))
		if w.ckpt != nil {
			w.ckpt.committed()
		}
	}
	for _, m := range members {
		m.res <- err
	}
}

// abandon rolls the open transaction back and fails the finished members
// and the running one (if any) with err.
func (w *writer) abandon(members []*writeTx, running *writeTx, err error) {
	w.exec("ROLLBACK")
	for _, m := range members {
		m.res <- err
	}
	if running != nil {
		running.refuse(err)
	}
}

// stallTimer returns the committer's stall watchdog timer, started for
// StallTimeout: one timer serves every await, rather than a new one per
// transaction.
func (w *writer) stallTimer() clockwork.Timer {
	if w.watchdog == nil {
		w.watchdog = w.clock.NewTimer(w.stall)
	} else {
		w.watchdog.Reset(w.stall)
	}
	return w.watchdog
}

// refuse ends t, which holds the writer but has not had its turn, with err.
func (t *writeTx) refuse(err error) {
	t.refused = err
	close(t.turn)
}

// await gives t the writer and waits for its callback. The stall watchdog:
// when the callback has made no call on the connection for a whole
// StallTimeout, is not inside one, and others wait (finished members for
// the COMMIT, or queued transactions for the writer), t is aborted: its
// open rows are closed, its later statements fail, and await returns
// ErrStalled so that the batch rolls it back and goes on.
func (w *writer) await(t *writeTx, members []*writeTx) error {
	seen := w.cc.calls.Load()
	close(t.turn)
	if w.stall <= 0 {
		return <-t.done
	}
	timer := w.stallTimer()
	defer func() {
		if !timer.Stop() {
			// Fired and not read: drained, so that the next await does
			// not take the old tick for its own.
			select {
			case <-timer.Chan():
			default:
			}
		}
	}()
	for {
		select {
		case err := <-t.done:
			return err
		case <-timer.Chan():
			calls := w.cc.calls.Load()
			waiting := len(members) > 0 || len(w.queue) > 0 || len(w.urgent) > 0
			if calls == seen && waiting && !w.cc.inCall.Load() &&
				t.abort(func() bool { return w.cc.calls.Load() == seen && !w.cc.inCall.Load() }) {
				w.db.stats.stalled.Add(1)
				return ErrStalled
			}
			seen = calls
			timer.Reset(w.stall)
		}
	}
}
