package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/sqlite"
)

// limit bounds every wait of these tests; none expires unless a test fails.
const limit = 20 * time.Second

// openWith opens a database in a temporary folder with a table t. Without
// a Clock in opts it gets a fake one, so that MaxBatchTime never splits a
// batch and the stall watchdog never fires unless a test moves the clock.
func openWith(t *testing.T, opts sqlite.Options) *sqlite.DB {
	t.Helper()
	if opts.Clock == nil {
		opts.Clock = clockwork.NewFakeClock()
	}
	db, err := sqlite.OpenOptions(context.Background(), filepath.Join(t.TempDir(), "b.db"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	mustUpdate(t, db, `CREATE TABLE t (k TEXT PRIMARY KEY, v BIGINT)`)
	return db
}

func mustUpdate(t *testing.T, db store.DB, q string, args ...any) {
	t.Helper()
	ctx := context.Background()
	if err := db.Update(ctx, func(tx store.Tx) error { _, err := tx.Exec(ctx, q, args...); return err }); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func insert(ctx context.Context, tx store.Tx, k string) error {
	_, err := tx.Exec(ctx, `INSERT INTO t (k, v) VALUES (?, 1)`, k)
	return err
}

func keys(t *testing.T, db store.DB) map[string]bool {
	t.Helper()
	ctx := context.Background()
	got := map[string]bool{}
	err := db.View(ctx, func(tx store.Tx) error {
		rows, err := tx.Query(ctx, `SELECT k FROM t`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				return err
			}
			got[k] = true
		}
		return rows.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// queueCounter is an enqueue hook: queued(n) is closed once n transactions
// were queued since it was made.
type queueCounter struct {
	mu    sync.Mutex
	n     int
	waits map[int]chan struct{}
}

func newQueueCounter(db *sqlite.DB) *queueCounter {
	q := &queueCounter{waits: map[int]chan struct{}{}}
	sqlite.SetEnqueued(db, func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		q.n++
		if c, ok := q.waits[q.n]; ok {
			close(c)
		}
	})
	return q
}

func (q *queueCounter) queued(n int) <-chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	c, ok := q.waits[n]
	if !ok {
		c = make(chan struct{})
		q.waits[n] = c
		if q.n >= n {
			close(c)
		}
	}
	return c
}

func wait(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(limit):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// holdWriter starts an Update whose callback writes key and then waits for
// release; it returns once the callback runs, and the Update's result comes
// on the returned channel.
func holdWriter(t *testing.T, db store.DB, key string, release <-chan struct{}) <-chan error {
	t.Helper()
	ctx := context.Background()
	inside := make(chan struct{})
	res := make(chan error, 1)
	go func() {
		res <- db.Update(ctx, func(tx store.Tx) error {
			if err := insert(ctx, tx, key); err != nil {
				return err
			}
			close(inside)
			<-release
			return nil
		})
	}()
	wait(t, inside, "the first transaction's callback")
	return res
}

// Transactions queued behind one another share one COMMIT; each keeps its
// own outcome: a failing one (its error, a constraint violation, a panic)
// is rolled back to its savepoint and the others commit.
func TestGroupCommitSavepointIsolation(t *testing.T) {
	ctx := context.Background()
	db := openWith(t, sqlite.Options{})
	q := newQueueCounter(db)
	release := make(chan struct{})
	first := holdWriter(t, db, "first", release) // queued #1

	boom := errors.New("boom")
	type outcome struct {
		name string
		err  error
	}
	results := make(chan outcome, 4)
	run := func(name string, fn func(tx store.Tx) error) {
		go func() {
			defer func() {
				if p := recover(); p != nil {
					results <- outcome{name, fmt.Errorf("panic: %v", p)}
				}
			}()
			results <- outcome{name, db.Update(ctx, fn)}
		}()
	}
	run("fails", func(tx store.Tx) error {
		if err := insert(ctx, tx, "fails-1"); err != nil {
			return err
		}
		if err := insert(ctx, tx, "fails-2"); err != nil {
			return err
		}
		return boom
	})
	wait(t, q.queued(2), "queued 2")
	run("ok-1", func(tx store.Tx) error { return insert(ctx, tx, "ok-1") })
	wait(t, q.queued(3), "queued 3")
	run("conflict", func(tx store.Tx) error {
		if err := insert(ctx, tx, "conflict-1"); err != nil {
			return err
		}
		return insert(ctx, tx, "first") // primary key taken by the first transaction
	})
	wait(t, q.queued(4), "queued 4")
	run("panics", func(tx store.Tx) error {
		insert(ctx, tx, "panics-1")
		panic("oops")
	})
	wait(t, q.queued(5), "queued 5")
	run("ok-2", func(tx store.Tx) error { return insert(ctx, tx, "ok-2") })
	wait(t, q.queued(6), "queued 6")

	before := db.Stats()
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("first: %v", err)
	}
	got := map[string]error{}
	for range 5 {
		o := <-results
		got[o.name] = o.err
	}
	if !errors.Is(got["fails"], boom) {
		t.Errorf("fails returned %v, want its own error", got["fails"])
	}
	if got["conflict"] == nil {
		t.Error("conflict returned nil, want the constraint error")
	}
	if got["panics"] == nil || got["panics"].Error() != "panic: oops" {
		t.Errorf("panics: %v, want the panic to reach its caller", got["panics"])
	}
	for _, ok := range []string{"ok-1", "ok-2"} {
		if got[ok] != nil {
			t.Errorf("%s returned %v", ok, got[ok])
		}
	}
	want := map[string]bool{"first": true, "ok-1": true, "ok-2": true}
	if k := keys(t, db); fmt.Sprint(k) != fmt.Sprint(want) {
		t.Fatalf("rows %v, want %v", k, want)
	}
	after := db.Stats()
	if c := after.Commits - before.Commits; c != 1 {
		t.Errorf("%d commits for the six transactions, want 1 (one batch)", c)
	}
	if c := after.Committed - before.Committed; c != 3 {
		t.Errorf("%d transactions committed, want 3", c)
	}
}

// An Update returns only after the COMMIT that holds its writes: while a
// later transaction of its batch runs, the earlier one has not returned and
// readers do not see its rows.
func TestResultOnlyAfterCommit(t *testing.T) {
	ctx := context.Background()
	db := openWith(t, sqlite.Options{})
	q := newQueueCounter(db)
	release := make(chan struct{})
	first := holdWriter(t, db, "a", release)
	second := make(chan error, 1)
	var sawFirst error
	var seen int
	go func() {
		second <- db.Update(ctx, func(tx store.Tx) error {
			select {
			case err := <-first:
				sawFirst = fmt.Errorf("the first Update returned (%v) before its commit", err)
			default:
			}
			err := db.View(ctx, func(r store.Tx) error {
				return r.QueryRow(ctx, `SELECT count(*) FROM t WHERE k = 'a'`).Scan(&seen)
			})
			if err != nil {
				return err
			}
			return insert(ctx, tx, "b")
		})
	}()
	wait(t, q.queued(2), "the second transaction queued")
	close(release)
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	if sawFirst != nil {
		t.Fatal(sawFirst)
	}
	if seen != 0 {
		t.Fatal("a reader saw the first transaction's row before its commit")
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if k := keys(t, db); !k["a"] || !k["b"] {
		t.Fatalf("rows %v after both returned", k)
	}
}

// The batch bounds: with MaxBatch 2, four queued transactions take two
// commits.
func TestBatchBound(t *testing.T) {
	ctx := context.Background()
	db := openWith(t, sqlite.Options{MaxBatch: 2})
	q := newQueueCounter(db)
	release := make(chan struct{})
	first := holdWriter(t, db, "k0", release)
	errs := make(chan error, 3)
	for i := 1; i <= 3; i++ {
		go func() { errs <- db.Update(ctx, func(tx store.Tx) error { return insert(ctx, tx, fmt.Sprint("k", i)) }) }()
		wait(t, q.queued(i+1), "queued")
	}
	before := db.Stats()
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if c := db.Stats().Commits - before.Commits; c != 2 {
		t.Fatalf("%d commits, want 2", c)
	}
	if n := len(keys(t, db)); n != 4 {
		t.Fatalf("%d rows, want 4", n)
	}
}

// An Update marked store.WithUrgent goes before the ordinary ones queued
// ahead of it: with MaxBatch 1 it starts the next batch, otherwise it
// joins the open one as its next member, and that batch then commits
// without taking the ordinary ones (they share the next); the ordinary
// ones keep their order and every transaction commits.
func TestUrgentGoesFirst(t *testing.T) {
	for _, tc := range []struct {
		maxBatch int
		commits  int64
	}{{1, 4}, {2, 2}, {64, 2}} {
		t.Run(fmt.Sprint("MaxBatch=", tc.maxBatch), func(t *testing.T) {
			ctx := context.Background()
			db := openWith(t, sqlite.Options{MaxBatch: tc.maxBatch})
			q := newQueueCounter(db)
			var mu sync.Mutex
			var order []string
			release := make(chan struct{})
			first := holdWriter(t, db, "k0", release)
			errs := make(chan error, 3)
			for i, k := range []string{"o1", "o2", "u"} {
				uctx := ctx
				if k == "u" {
					uctx = store.WithUrgent(ctx)
				}
				go func() {
					errs <- db.Update(uctx, func(tx store.Tx) error {
						mu.Lock()
						order = append(order, k)
						mu.Unlock()
						return insert(ctx, tx, k)
					})
				}()
				wait(t, q.queued(i+2), "queued "+k)
			}
			before := db.Stats()
			close(release)
			if err := <-first; err != nil {
				t.Fatal(err)
			}
			for range 3 {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			if got := fmt.Sprint(order); got != "[u o1 o2]" {
				t.Errorf("callbacks ran in the order %s, want [u o1 o2]", got)
			}
			if c := db.Stats().Commits - before.Commits; c != tc.commits {
				t.Errorf("%d commits, want %d", c, tc.commits)
			}
			if n := len(keys(t, db)); n != 4 {
				t.Fatalf("%d rows, want 4", n)
			}
		})
	}
}

// Urgent transactions do not starve the ordinary ones: after a batch an
// urgent transaction started, the oldest ordinary one starts the next,
// even with more urgent ones queued.
func TestUrgentDoesNotStarve(t *testing.T) {
	ctx := context.Background()
	db := openWith(t, sqlite.Options{MaxBatch: 1})
	q := newQueueCounter(db)
	var mu sync.Mutex
	var order []string
	release := make(chan struct{})
	first := holdWriter(t, db, "k0", release)
	errs := make(chan error, 4)
	for i, k := range []string{"o1", "o2", "u1", "u2"} {
		uctx := ctx
		if k[0] == 'u' {
			uctx = store.WithUrgent(ctx)
		}
		go func() {
			errs <- db.Update(uctx, func(tx store.Tx) error {
				mu.Lock()
				order = append(order, k)
				mu.Unlock()
				return insert(ctx, tx, k)
			})
		}()
		wait(t, q.queued(i+2), "queued "+k)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := fmt.Sprint(order); got != "[u1 o1 u2 o2]" {
		t.Errorf("callbacks ran in the order %s, want [u1 o1 u2 o2]", got)
	}
}

// A context that ends while its transaction waits for the writer ends the
// wait, and the callback never runs; a statement whose context is done
// fails, and the callback that returns that error is rolled back whole.
func TestCancellation(t *testing.T) {
	ctx := context.Background()
	db := openWith(t, sqlite.Options{})
	q := newQueueCounter(db)
	release := make(chan struct{})
	first := holdWriter(t, db, "held", release)

	cctx, cancel := context.WithCancel(ctx)
	ran := make(chan struct{}, 1)
	res := make(chan error, 1)
	go func() {
		res <- db.Update(cctx, func(tx store.Tx) error { ran <- struct{}{}; return insert(ctx, tx, "cancelled") })
	}()
	wait(t, q.queued(2), "queued")
	cancel()
	select {
	case err := <-res:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("queued Update returned %v, want context.Canceled", err)
		}
	case <-time.After(limit):
		t.Fatal("a cancelled Update kept waiting for the writer")
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	select {
	case <-ran:
		t.Fatal("the callback of a cancelled Update ran")
	default:
	}

	sctx, scancel := context.WithCancel(ctx)
	err := db.Update(ctx, func(tx store.Tx) error {
		if err := insert(sctx, tx, "before-cancel"); err != nil {
			return err
		}
		scancel()
		if err := insert(sctx, tx, "after-cancel"); err != nil {
			return err
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Update returned %v, want context.Canceled from the statement", err)
	}
	var n int
	err = db.View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(sctx, `SELECT count(*) FROM t`).Scan(&n)
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("QueryRow with a done context: %v, want context.Canceled", err)
	}
	if k := keys(t, db); len(k) != 1 || !k["held"] {
		t.Fatalf("rows %v, want only held", k)
	}
	if err := db.View(sctx, func(store.Tx) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("View with a done context: %v", err)
	}
}

// An Update called from inside an Update's callback would wait for the
// writer its caller holds. The watchdog rolls the outer one back after
// StallTimeout of idleness; the inner one then commits on its own.
func TestNestedUpdateStalls(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	db := openWith(t, sqlite.Options{Clock: clock, StallTimeout: time.Second, CheckpointInterval: -1})
	q := newQueueCounter(db)
	res := make(chan error, 1)
	var inner, after error
	go func() {
		res <- db.Update(ctx, func(tx store.Tx) error {
			if err := insert(ctx, tx, "outer"); err != nil {
				return err
			}
			inner = db.Update(ctx, func(tx store.Tx) error { return insert(ctx, tx, "inner") })
			after = insert(ctx, tx, "outer-2")
			return nil
		})
	}()
	wait(t, q.queued(2), "the inner Update queued")
	advanceIdle(t, clock, 2)
	select {
	case err := <-res:
		if !errors.Is(err, sqlite.ErrStalled) {
			t.Fatalf("outer Update returned %v, want ErrStalled", err)
		}
	case <-time.After(limit):
		t.Fatal("the nested Update deadlocked")
	}
	if inner != nil {
		t.Fatalf("inner Update: %v", inner)
	}
	if !errors.Is(after, sqlite.ErrStalled) {
		t.Fatalf("a statement after the abort returned %v, want ErrStalled", after)
	}
	if k := keys(t, db); len(k) != 1 || !k["inner"] {
		t.Fatalf("rows %v, want only inner", k)
	}
	if s := db.Stats().Stalled; s != 1 {
		t.Fatalf("Stalled = %d", s)
	}
	// The writer goes on.
	mustUpdate(t, db, `INSERT INTO t (k, v) VALUES ('later', 1)`)
}

// advanceIdle moves the fake clock by the stall timeout n times, each time
// once the committer waits on its timer.
func advanceIdle(t *testing.T, clock *clockwork.FakeClock, n int) {
	t.Helper()
	for range n {
		bctx, cancel := context.WithTimeout(context.Background(), limit)
		err := clock.BlockUntilContext(bctx, 1)
		cancel()
		if err != nil {
			t.Fatal("the committer never waited on its stall timer")
		}
		clock.Advance(time.Second)
	}
}

// A callback in a batch that waits for an earlier member's Update to
// return would deadlock the batch (the earlier one returns only after the
// commit). The watchdog rolls the waiting one back; the earlier commits.
func TestStallBreaksWaitOnEarlierMember(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	db := openWith(t, sqlite.Options{Clock: clock, StallTimeout: time.Second, CheckpointInterval: -1})
	q := newQueueCounter(db)
	release := make(chan struct{})
	first := holdWriter(t, db, "a", release)
	firstDone := make(chan error, 1)
	bInside := make(chan struct{})
	res := make(chan error, 1)
	var rowsErr error
	go func() {
		res <- db.Update(ctx, func(tx store.Tx) error {
			if err := insert(ctx, tx, "b"); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, `SELECT k FROM t`) // left open across the wait
			if err != nil {
				return err
			}
			close(bInside)
			<-firstDone // waits for the first Update's return
			for rows.Next() {
			}
			rowsErr = rows.Err()
			return insert(ctx, tx, "b-2")
		})
	}()
	wait(t, q.queued(2), "the second transaction queued")
	close(release)
	wait(t, bInside, "the second callback")
	advanceIdle(t, clock, 2)
	select {
	case err := <-first:
		firstDone <- err
		if err != nil {
			t.Fatalf("first: %v", err)
		}
	case <-time.After(limit):
		t.Fatal("the batch deadlocked")
	}
	if err := <-res; !errors.Is(err, sqlite.ErrStalled) {
		t.Fatalf("second Update returned %v, want ErrStalled", err)
	}
	_ = rowsErr // closed rows end the iteration; any error is the abort's
	if k := keys(t, db); len(k) != 1 || !k["a"] {
		t.Fatalf("rows %v, want only a", k)
	}
}

// A callback that is busy (runs statements) is never taken for stalled,
// however long it runs, and a lone callback that waits is not aborted
// while nobody waits for the writer.
func TestNoStallWhileBusyOrAlone(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	db := openWith(t, sqlite.Options{Clock: clock, StallTimeout: time.Second, CheckpointInterval: -1})
	step := make(chan struct{})
	res := make(chan error, 1)
	go func() {
		res <- db.Update(ctx, func(tx store.Tx) error {
			for i := range 3 {
				<-step
				if err := insert(ctx, tx, fmt.Sprint("k", i)); err != nil {
					return err
				}
			}
			return nil
		})
	}()
	for range 3 {
		advanceIdle(t, clock, 2) // idle, but alone: not aborted
		step <- struct{}{}
	}
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	if n := len(keys(t, db)); n != 3 {
		t.Fatalf("%d rows", n)
	}
}

// Statements are prepared once per connection. The same query nested in
// its own iteration, and a cache smaller than the statements in use, still
// give right answers.
func TestStatementCache(t *testing.T) {
	ctx := context.Background()
	for _, size := range []int{256, 2, -1} {
		t.Run(fmt.Sprint("cache=", size), func(t *testing.T) {
			db := openWith(t, sqlite.Options{StatementCache: size})
			for i := range 5 {
				mustUpdate(t, db, `INSERT INTO t (k, v) VALUES (?, ?)`, fmt.Sprint("k", i), i)
			}
			p0 := db.Stats().Prepares
			for range 50 {
				mustUpdate(t, db, `UPDATE t SET v = v + 1 WHERE k = ?`, "k0")
			}
			prepared := db.Stats().Prepares - p0
			if size == 256 && prepared > 3 { // the UPDATE, BEGIN, COMMIT at most
				t.Errorf("%d statements prepared for 50 runs of one", prepared)
			}
			if size < 0 && prepared < 50 {
				t.Errorf("no cache, yet %d prepares for 50 statements", prepared)
			}
			const q = `SELECT k, v FROM t ORDER BY k`
			var pairs int
			err := db.Update(ctx, func(tx store.Tx) error {
				outer, err := tx.Query(ctx, q)
				if err != nil {
					return err
				}
				defer outer.Close()
				for outer.Next() {
					inner, err := tx.Query(ctx, q) // the cached statement is busy
					if err != nil {
						return err
					}
					for inner.Next() {
						var k string
						var v int
						if err := inner.Scan(&k, &v); err != nil {
							return err
						}
						pairs++
					}
					inner.Close()
					// other statements push the busy one out of a small cache
					var n int
					if err := tx.QueryRow(ctx, `SELECT count(*) FROM t WHERE v >= ?`, 0).Scan(&n); err != nil {
						return err
					}
					if err := tx.QueryRow(ctx, `SELECT count(*) FROM t WHERE k <> ?`, "x").Scan(&n); err != nil {
						return err
					}
				}
				return outer.Err()
			})
			if err != nil || pairs != 25 {
				t.Fatalf("nested iteration: %d pairs, %v; want 25", pairs, err)
			}
			var v int
			if err := db.View(ctx, func(tx store.Tx) error {
				return tx.QueryRow(ctx, `SELECT v FROM t WHERE k = ?`, "k0").Scan(&v)
			}); err != nil || v != 50 {
				t.Fatalf("k0 = %d, %v; want 50", v, err)
			}
		})
	}
}

// After Close, Update and View fail with a clear error.
func TestClosed(t *testing.T) {
	ctx := context.Background()
	db := openWith(t, sqlite.Options{})
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Update(ctx, func(store.Tx) error { return nil }); !errors.Is(err, sqlite.ErrClosed) {
		t.Fatalf("Update after Close: %v", err)
	}
	if err := db.View(ctx, func(store.Tx) error { return nil }); err == nil {
		t.Fatal("View after Close succeeded")
	}
}

// Many concurrent writers: every transaction that returned nil is there,
// every failed one is absent, and the batches commit fewer times than there
// were transactions only if they overlapped (no assertion on that: timing).
func TestConcurrentWriters(t *testing.T) {
	ctx := context.Background()
	db := openWith(t, sqlite.Options{})
	const writers, each = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				k := fmt.Sprintf("w%d-%d", w, i)
				err := db.Update(ctx, func(tx store.Tx) error {
					if err := insert(ctx, tx, k); err != nil {
						return err
					}
					if err := insert(ctx, tx, k+"-x"); err != nil {
						return err
					}
					if i%5 == 4 {
						return errFail
					}
					return nil
				})
				if err != nil && !errors.Is(err, errFail) {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	k := keys(t, db)
	for w := range writers {
		for i := range each {
			key := fmt.Sprintf("w%d-%d", w, i)
			want := i%5 != 4
			if k[key] != want || k[key+"-x"] != want {
				t.Fatalf("%s: present %v/%v, want %v", key, k[key], k[key+"-x"], want)
			}
		}
	}
}

var errFail = errors.New("deliberate failure")
