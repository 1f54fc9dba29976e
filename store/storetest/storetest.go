// Package storetest is the conformance suite of store.DB: every
// implementation (store/sqlite, store/postgres) runs it, so the packages
// above store can rely on the same behaviour from each.
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.DB { … a fresh, empty database … })
//	}
package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/agentry/agentry/store"
)

// Open returns a fresh, empty database for t, closed when t ends.
type Open func(t *testing.T) store.DB

// Run runs the suite against the databases open makes.
func Run(t *testing.T, open Open) {
	tests := []struct {
		name string
		fn   func(t *testing.T, db store.DB)
	}{
		{"CommitAndRollback", testCommitAndRollback},
		{"Panic", testPanic},
		{"ViewIsReadOnly", testViewIsReadOnly},
		{"ViewSeesOneSnapshot", testViewSnapshot},
		{"FailedStatementFailsTransaction", testFailedStatement},
		{"IndependentConcurrentWriters", testIndependentWriters},
		{"LockedReadModifyWrite", testLockedCounter},
		{"NextSequence", testNextSequence},
		{"GuardedInsertCap", testGuardedCap},
		{"DialectDDL", testDialect},
		{"Placeholders", testPlaceholders},
		{"Upsert", testUpsert},
		{"MigrateOnce", testMigrateOnce},
		{"MigrateErrorWrapped", testMigrateError},
		{"SchemaTooNewRefused", testSchemaTooNew},
		{"CancelledBeforeStart", testCancelledBefore},
		{"CancelledStatementRollsBack", testCancelledStatement},
		{"CancelAfterCallbackStillCommits", testCancelAfter},
		{"Fence", testFence},
		{"OwnedTables", testOwnedTables},
		{"OwnedTablesConcurrentCreate", testOwnedConcurrentCreate},
		{"Closed", testClosed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, open(t)) })
	}
}

func exec(t *testing.T, db store.DB, q string, args ...any) {
	t.Helper()
	ctx := context.Background()
	if err := db.Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, q, args...)
		return err
	}); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func count(t *testing.T, db store.DB, q string, args ...any) int64 {
	t.Helper()
	ctx := context.Background()
	var n int64
	if err := db.View(ctx, func(tx store.Tx) error { return tx.QueryRow(ctx, q, args...).Scan(&n) }); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// A transaction commits all its writes on nil and none of them on error,
// and Update returns the callback's own error.
func testCommitAndRollback(t *testing.T, db store.DB) {
	ctx := context.Background()
	exec(t, db, `CREATE TABLE t (k TEXT PRIMARY KEY, v BIGINT NOT NULL)`)
	err := db.Update(ctx, func(tx store.Tx) error {
		for i := range 3 {
			if _, err := tx.Exec(ctx, `INSERT INTO t (k, v) VALUES (?, ?)`, fmt.Sprint("a", i), i); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err = db.Update(ctx, func(tx store.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO t (k, v) VALUES (?, ?)`, "b", 1); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE t SET v = v + 100`); err != nil {
			return err
		}
		return fmt.Errorf("wrapped: %w", boom)
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Update returned %v, want the callback's error", err)
	}
	if n := count(t, db, `SELECT count(*) FROM t`); n != 3 {
		t.Fatalf("%d rows, want 3: a failed transaction left rows", n)
	}
	if n := count(t, db, `SELECT COALESCE(SUM(v), 0) FROM t`); n != 0+1+2 {
		t.Fatalf("sum %d: a failed transaction's update was kept", n)
	}
}

// A panic in the callback rolls back and goes on up the caller's stack;
// the database stays usable.
func testPanic(t *testing.T, db store.DB) {
	ctx := context.Background()
	exec(t, db, `CREATE TABLE t (k TEXT PRIMARY KEY)`)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not reach the caller")
			}
		}()
		db.Update(ctx, func(tx store.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO t (k) VALUES (?)`, "p"); err != nil {
				return err
			}
			panic("boom")
		})
	}()
	exec(t, db, `INSERT INTO t (k) VALUES (?)`, "after")
	if n := count(t, db, `SELECT count(*) FROM t`); n != 1 {
		t.Fatalf("%d rows, want only the one written after the panic", n)
	}
}

func testViewIsReadOnly(t *testing.T, db store.DB) {
	ctx := context.Background()
	exec(t, db, `CREATE TABLE t (k TEXT PRIMARY KEY)`)
	err := db.View(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO t (k) VALUES (?)`, "x")
		return err
	})
	if err == nil {
		t.Fatal("a View wrote")
	}
	if n := count(t, db, `SELECT count(*) FROM t`); n != 0 {
		t.Fatal("a View's write landed")
	}
}

// A View sees one snapshot: a write that commits while it runs is not seen
// by its later statements. (A connection's replay lists a parent's runs and
// then reads their chunks in one View; a terminal committed in between
// must not reach it half.)
func testViewSnapshot(t *testing.T, db store.DB) {
	ctx := context.Background()
	exec(t, db, `CREATE TABLE t (k TEXT PRIMARY KEY)`)
	exec(t, db, `INSERT INTO t (k) VALUES (?)`, "a")
	// Failures are returned, not raised with t.Fatal: the View's
	// transaction must end before the test does.
	var inserted error
	err := db.View(ctx, func(tx store.Tx) error {
		var first, second int64
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&first); err != nil {
			return err
		}
		inserted = db.Update(ctx, func(w store.Tx) error {
			_, err := w.Exec(ctx, `INSERT INTO t (k) VALUES (?)`, "b")
			return err
		})
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&second); err != nil {
			return err
		}
		if first != 1 || second != 1 {
			return fmt.Errorf("the View read %d rows, then %d after a write committed; want 1 both times", first, second)
		}
		return nil
	})
	if inserted != nil {
		t.Fatalf("the write during the View: %v", inserted)
	}
	if err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, `SELECT count(*) FROM t`); n != 2 {
		t.Fatalf("after the View: %d rows, want 2", n)
	}
}

// A statement that fails fails its transaction even when the callback
// ignores the error: nothing of it commits (on PostgreSQL a failed
// statement aborts the transaction, so the portable contract is that).
func testFailedStatement(t *testing.T, db store.DB) {
	ctx := context.Background()
	exec(t, db, `CREATE TABLE t (k TEXT PRIMARY KEY)`)
	exec(t, db, `INSERT INTO t (k) VALUES (?)`, "dup")
	var stmtErr error
	err := db.Update(ctx, func(tx store.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO t (k) VALUES (?)`, "dup"); err == nil {
			return errors.New("duplicate key accepted")
		} else {
			stmtErr = err
		}
		return stmtErr
	})
	if err == nil || !errors.Is(err, stmtErr) {
		t.Fatalf("Update returned %v, want the statement's error %v", err, stmtErr)
	}
}

// Concurrent Update transactions are each all or nothing: the failing
// ones do not undo the others, the others do not carry the failing ones.
func testIndependentWriters(t *testing.T, db store.DB) {
	ctx := context.Background()
	exec(t, db, `CREATE TABLE t (k TEXT PRIMARY KEY, w BIGINT NOT NULL)`)
	const n = 40
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			errs[i] = db.Update(ctx, func(tx store.Tx) error {
				for j := range 3 {
					if _, err := tx.Exec(ctx, `INSERT INTO t (k, w) VALUES (?, ?)`, fmt.Sprintf("%d-%d", i, j), i); err != nil {
						return err
					}
				}
				if i%3 == 0 {
					return fmt.Errorf("writer %d fails", i)
				}
				return nil
			})
		})
	}
	wg.Wait()
	for i, err := range errs {
		want := i%3 == 0
		if (err != nil) != want {
			t.Fatalf("writer %d: %v", i, err)
		}
		rows := count(t, db, `SELECT count(*) FROM t WHERE w = ?`, i)
		if want && rows != 0 || !want && rows != 3 {
			t.Fatalf("writer %d (failing %v) left %d rows", i, want, rows)
		}
	}
}

// A read-then-write under SELECT … FOR UPDATE loses no update among
// concurrent writers (on SQLite the single writer does it; on PostgreSQL
// the row lock).
func testLockedCounter(t *testing.T, db store.DB) {
	ctx := context.Background()
	exec(t, db, `CREATE TABLE c (k TEXT PRIMARY KEY, v BIGINT NOT NULL)`)
	exec(t, db, `INSERT INTO c (k, v) VALUES (?, ?)`, "x", 0)
	const n = 30
	var wg sync.WaitGroup
	var failed sync.Map
	for i := range n {
		wg.Go(func() {
			err := db.Update(ctx, func(tx store.Tx) error {
				var v int64
				if err := tx.QueryRow(ctx, `SELECT v FROM c WHERE k = ? FOR UPDATE`, "x").Scan(&v); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `UPDATE c SET v = ? WHERE k = ?`, v+1, "x")
				return err
			})
			if err != nil {
				failed.Store(i, err)
			}
		})
	}
	wg.Wait()
	failed.Range(func(k, v any) bool { t.Errorf("writer %v: %v", k, v); return true })
	if v := count(t, db, `SELECT v FROM c WHERE k = ?`, "x"); v != n {
		t.Fatalf("counter %d after %d increments: updates were lost", v, n)
	}
}

// MAX(sequence)+1 after locking the owning row gives each concurrent
// writer its own number, with no gap and no duplicate.
func testNextSequence(t *testing.T, db store.DB) {
	ctx := context.Background()
	exec(t, db, `CREATE TABLE owners (id TEXT PRIMARY KEY)`)
	exec(t, db, `CREATE TABLE items (owner TEXT NOT NULL, seq BIGINT NOT NULL, PRIMARY KEY (owner, seq))`)
	exec(t, db, `INSERT INTO owners (id) VALUES (?)`, "o")
	const n = 30
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			errs <- db.Update(ctx, func(tx store.Tx) error {
				var id string
				if err := tx.QueryRow(ctx, `SELECT id FROM owners WHERE id = ? FOR UPDATE`, "o").Scan(&id); err != nil {
					return err
				}
				var next int64
				if err := tx.QueryRow(ctx, `SELECT COALESCE(MAX(seq), -1) + 1 FROM items WHERE owner = ?`, "o").Scan(&next); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `INSERT INTO items (owner, seq) VALUES (?, ?)`, "o", next)
				return err
			})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if c, m := count(t, db, `SELECT count(*) FROM items`), count(t, db, `SELECT MAX(seq) FROM items`); c != n || m != n-1 {
		t.Fatalf("%d items, highest sequence %d; want %d and %d", c, m, n, n-1)
	}
}

// A concurrency cap checked by a guarded INSERT … SELECT … WHERE (SELECT
// COUNT(*) …) < cap, after locking the owning row, admits exactly cap of
// many concurrent writers.
func testGuardedCap(t *testing.T, db store.DB) {
	ctx := context.Background()
	exec(t, db, `CREATE TABLE owners (id TEXT PRIMARY KEY)`)
	exec(t, db, `CREATE TABLE runs (owner TEXT NOT NULL, id TEXT NOT NULL, started BIGINT NOT NULL, PRIMARY KEY (owner, id))`)
	exec(t, db, `INSERT INTO owners (id) VALUES (?)`, "o")
	const n, limit = 30, 7
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for i := range n {
		wg.Go(func() {
			err := db.Update(ctx, func(tx store.Tx) error {
				var id string
				if err := tx.QueryRow(ctx, `SELECT id FROM owners WHERE id = ? FOR UPDATE`, "o").Scan(&id); err != nil {
					return err
				}
				res, err := tx.Exec(ctx, `INSERT INTO runs (owner, id, started)
					SELECT ?, ?, ? WHERE (SELECT COUNT(*) FROM runs WHERE owner = ?) < ?`, "o", fmt.Sprint(i), int64(i), "o", limit)
				if err != nil {
					return err
				}
				if k, err := res.RowsAffected(); err != nil {
					return err
				} else if k == 1 {
					mu.Lock()
					admitted++
					mu.Unlock()
				}
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if c := count(t, db, `SELECT count(*) FROM runs`); c != limit || admitted != limit {
		t.Fatalf("%d rows, %d admitted; the cap is %d", c, admitted, limit)
	}
}

// The portable DDL: INTEGER PRIMARY KEY AUTOINCREMENT numbers rows (with
// RETURNING), INTEGER holds 64 bits, BLOB holds bytes, REAL floats.
func testDialect(t *testing.T, db store.DB) {
	ctx := context.Background()
	exec(t, db, `CREATE TABLE IF NOT EXISTS d (
		id INTEGER PRIMARY KEY AUTOINCREMENT,
		big INTEGER NOT NULL,
		raw BLOB,
		f REAL,
		flag INTEGER NOT NULL DEFAULT 0)`)
	exec(t, db, `CREATE TABLE IF NOT EXISTS d (id INTEGER PRIMARY KEY)`) // exists: nothing happens
	exec(t, db, `ALTER TABLE d ADD COLUMN extra INTEGER`)
	var ids []int64
	for i := range 3 {
		err := db.Update(ctx, func(tx store.Tx) error {
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO d (big, raw, f, extra) VALUES (?, ?, ?, ?) RETURNING id`,
				int64(1)<<40+int64(i), []byte{0, 1, 2, byte(i)}, 1.5, int64(i)).Scan(&id)
			ids = append(ids, id)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if ids[0] >= ids[1] || ids[1] >= ids[2] {
		t.Fatalf("ids %v do not increase", ids)
	}
	var big int64
	var raw []byte
	var f float64
	var flag int
	err := db.View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT big, raw, f, flag FROM d WHERE id = ?`, ids[2]).Scan(&big, &raw, &f, &flag)
	})
	if err != nil {
		t.Fatal(err)
	}
	if big != 1<<40+2 || string(raw) != "\x00\x01\x02\x02" || f != 1.5 || flag != 0 {
		t.Fatalf("read back %d %v %v %d", big, raw, f, flag)
	}
}

// "?" inside string literals and comments is not a placeholder.
func testPlaceholders(t *testing.T, db store.DB) {
	ctx := context.Background()
	exec(t, db, `CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT NOT NULL)`)
	exec(t, db, `INSERT INTO t (k, v) VALUES (?, '?') -- a comment?
		`, "a")
	exec(t, db, `INSERT INTO t /* why? */ (k, v) VALUES ('it''s?', ?)`, "b")
	var v string
	err := db.View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT v FROM t WHERE k = ? AND v = '?'`, "a").Scan(&v)
	})
	if err != nil || v != "?" {
		t.Fatalf("v %q, %v", v, err)
	}
	if n := count(t, db, `SELECT count(*) FROM t WHERE k = 'it''s?' AND v = ?`, "b"); n != 1 {
		t.Fatalf("count %d", n)
	}
	// A parameter with no column to take its type from is cast.
	if n := count(t, db, `SELECT CAST(? AS BIGINT) + 1`, int64(41)); n != 42 {
		t.Fatalf("cast parameter: %d", n)
	}
}

func testUpsert(t *testing.T, db store.DB) {
	ctx := context.Background()
	exec(t, db, `CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT NOT NULL, n BIGINT NOT NULL DEFAULT 0)`)
	for _, v := range []string{"one", "two"} {
		exec(t, db, `INSERT INTO kv (k, v) VALUES (?, ?)
			ON CONFLICT (k) DO UPDATE SET v = excluded.v, n = kv.n + 1`, "k", v)
	}
	exec(t, db, `INSERT INTO kv (k, v) VALUES (?, ?) ON CONFLICT (k) DO NOTHING`, "k", "three")
	var v string
	var n int64
	if err := db.View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT v, n FROM kv WHERE k = ?`, "k").Scan(&v, &n)
	}); err != nil {
		t.Fatal(err)
	}
	if v != "two" || n != 1 {
		t.Fatalf("v %q n %d", v, n)
	}
}

// Concurrent Migrate calls run each step once.
func testMigrateOnce(t *testing.T, db store.DB) {
	ctx := context.Background()
	ms := []store.Migration{
		{Version: 1, Statements: []string{
			`CREATE TABLE log (id INTEGER PRIMARY KEY AUTOINCREMENT, step BIGINT NOT NULL)`,
			`INSERT INTO log (step) VALUES (1)`}},
		{Version: 2, Statements: []string{`INSERT INTO log (step) VALUES (2)`}},
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() { errs <- store.Migrate(ctx, db, "conformance", ms) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM log`); n != 2 {
		t.Fatalf("%d steps ran, want 2", n)
	}
	ms = append(ms, store.Migration{Version: 3, Statements: []string{`INSERT INTO log (step) VALUES (3)`}})
	if err := store.Migrate(ctx, db, "conformance", ms); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, `SELECT count(*) FROM log`); n != 3 {
		t.Fatalf("%d steps ran, want 3", n)
	}
}

// A failing migration step is reported with its component and version
// and leaves nothing behind.
func testMigrateError(t *testing.T, db store.DB) {
	ctx := context.Background()
	err := store.Migrate(ctx, db, "broken", []store.Migration{
		{Version: 1, Statements: []string{`CREATE TABLE ok1 (x BIGINT)`}},
		{Version: 2, Statements: []string{`CREATE TABLE nope (`}},
	})
	if err == nil || !strings.Contains(err.Error(), "migrate broken") || !strings.Contains(err.Error(), "version 2") {
		t.Fatalf("error %v does not name the component and the version", err)
	}
	err = db.View(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `SELECT count(*) FROM ok1`)
		return err
	})
	if err == nil {
		t.Fatal("the first step of a failed migration was kept")
	}
}

// A schema recorded at a version newer than the code's migrations (a
// newer build migrated the database) is refused by CheckSchemas with
// ErrSchemaTooNew; Migrate leaves it as it is (a process that started
// before goes on); the versions the code knows pass.
func testSchemaTooNew(t *testing.T, db store.DB) {
	ctx := context.Background()
	ms := []store.Migration{{Version: 1, Statements: []string{`CREATE TABLE newer1 (x BIGINT)`}}}
	if err := store.Migrate(ctx, db, "newer", ms); err != nil {
		t.Fatal(err)
	}
	if err := store.CheckSchemas(ctx, db, map[string]int{"newer": 1}); err != nil {
		t.Fatalf("CheckSchemas at the known version: %v", err)
	}
	// What a build with a second step records.
	if err := db.Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE schema_versions SET version = 2 WHERE component = 'newer'`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	err := store.CheckSchemas(ctx, db, map[string]int{"newer": 1, "other": 1})
	var tooNew *store.SchemaTooNewError
	if !errors.Is(err, store.ErrSchemaTooNew) || !errors.As(err, &tooNew) ||
		tooNew.Component != "newer" || tooNew.Version != 2 || tooNew.Known != 1 {
		t.Fatalf("CheckSchemas: %v, want a SchemaTooNewError for newer 2 > 1", err)
	}
	if !strings.Contains(err.Error(), `"newer" schema is at version 2, newer than this build knows (1)`) {
		t.Errorf("the error does not say what is wrong: %v", err)
	}
	if err := store.Migrate(ctx, db, "newer", ms); err != nil {
		t.Fatalf("Migrate of the older steps on the newer schema: %v", err)
	}
	if err := store.CheckSchemas(ctx, db, map[string]int{"newer": 2}); err != nil {
		t.Fatalf("CheckSchemas at the newer version: %v", err)
	}
}

// A done context stops Update and View before their callbacks.
func testCancelledBefore(t *testing.T, db store.DB) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	if err := db.Update(ctx, func(store.Tx) error { ran = true; return nil }); !errors.Is(err, context.Canceled) || ran {
		t.Fatalf("Update: %v, callback ran %v", err, ran)
	}
	if err := db.View(ctx, func(store.Tx) error { ran = true; return nil }); !errors.Is(err, context.Canceled) || ran {
		t.Fatalf("View: %v, callback ran %v", err, ran)
	}
}

// A statement whose context ended fails, and its transaction with it,
// even if the callback ignores the error.
func testCancelledStatement(t *testing.T, db store.DB) {
	bg := context.Background()
	exec(t, db, `CREATE TABLE t (k TEXT PRIMARY KEY)`)
	ctx, cancel := context.WithCancel(bg)
	err := db.Update(ctx, func(tx store.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO t (k) VALUES (?)`, "before"); err != nil {
			return err
		}
		cancel()
		_, err := tx.Exec(ctx, `INSERT INTO t (k) VALUES (?)`, "after")
		if !errors.Is(err, context.Canceled) {
			return fmt.Errorf("statement after cancel: %v", err)
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n); !errors.Is(err, context.Canceled) {
			return fmt.Errorf("query after cancel: %v", err)
		}
		return err
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Update: %v", err)
	}
	if n := count(t, db, `SELECT count(*) FROM t`); n != 0 {
		t.Fatal("a cancelled transaction committed")
	}
}

// Once the callback returned nil, the commit is not cancellable: Update
// reports the real outcome.
func testCancelAfter(t *testing.T, db store.DB) {
	exec(t, db, `CREATE TABLE t (k TEXT PRIMARY KEY)`)
	ctx, cancel := context.WithCancel(context.Background())
	err := db.Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO t (k) VALUES (?)`, "x")
		cancel()
		return err
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	if n := count(t, db, `SELECT count(*) FROM t`); n != 1 {
		t.Fatal("Update returned nil but did not commit")
	}
}
