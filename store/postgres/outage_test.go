package postgres_test

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/postgres"
)

// outageDB opens a database (default Options) with the table the outage
// tests write to: no key, so a transaction committed twice shows as two
// rows.
func outageDB(t *testing.T) *postgres.DB {
	t.Helper()
	db := open(t, postgres.Options{})
	ctx := context.Background()
	if err := db.Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `CREATE TABLE writes (name TEXT NOT NULL)`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return db
}

func insert(ctx context.Context, db *postgres.DB, name string) error {
	return db.Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO writes (name) VALUES (?)`, name)
		return err
	})
}

func rows(t *testing.T, db *postgres.DB, name string) int {
	t.Helper()
	ctx := context.Background()
	var n int
	if err := db.View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM writes WHERE name = ?`, name).Scan(&n)
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitUnavailable waits until db has failed n more attempts for want of
// the database (the call under test is retrying).
func waitUnavailable(t *testing.T, db *postgres.DB, from int64, done <-chan error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for db.Stats().Unavailable < from+2 {
		select {
		case err := <-done:
			t.Fatalf("the call ended during the outage: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the call does not retry")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestUpdateWaitsOutRestart: PostgreSQL stops at once (pg_ctl stop -m
// immediate) with the pool's connections open; an Update and a View made
// meanwhile wait for it, and once it is back (same port, recovered from
// its WAL) they complete: the write committed exactly once, the committed
// row from before the outage is there.
func TestUpdateWaitsOutRestart(t *testing.T) {
	ctx := context.Background()
	db := outageDB(t)
	if err := insert(ctx, db, "before"); err != nil {
		t.Fatal(err)
	}
	if err := pg.StopServer(true); err != nil {
		t.Fatal(err)
	}
	started := false
	defer func() {
		if !started {
			pg.StartServer()
		}
	}()
	from := db.Stats().Unavailable
	wrote := make(chan error, 1)
	go func() { wrote <- insert(ctx, db, "during") }()
	waitUnavailable(t, db, from, wrote)
	read := make(chan error, 1)
	go func() {
		read <- db.View(ctx, func(tx store.Tx) error {
			var n int
			return tx.QueryRow(ctx, `SELECT COUNT(*) FROM writes`).Scan(&n)
		})
	}()
	if err := pg.StartServer(); err != nil {
		t.Fatal(err)
	}
	started = true
	if err := <-wrote; err != nil {
		t.Fatalf("the Update made during the outage: %v", err)
	}
	if err := <-read; err != nil {
		t.Fatalf("the View made during the outage: %v", err)
	}
	if b, d := rows(t, db, "before"), rows(t, db, "during"); b != 1 || d != 1 {
		t.Fatalf("rows before %d, during %d; want 1 each", b, d)
	}
}

// TestRetryLimitGivesUp: with store.WithRetryLimit (a client's request) an
// Update during an outage gives up with store.ErrUnavailable, and nothing
// of it is committed.
func TestRetryLimitGivesUp(t *testing.T) {
	ctx := context.Background()
	db := outageDB(t)
	if err := pg.StopServer(false); err != nil {
		t.Fatal(err)
	}
	err := insert(store.WithRetryLimit(ctx, 100*time.Millisecond), db, "limited")
	if serr := pg.StartServer(); serr != nil {
		t.Fatal(serr)
	}
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Update during the outage: %v, want store.ErrUnavailable", err)
	}
	if n := rows(t, db, "limited"); n != 0 {
		t.Fatalf("%d rows of the failed Update", n)
	}
}

// TestLostCommitAnswer: the COMMIT happened but its answer was lost with
// the connection. Update asks the database what became of the transaction
// and reports success, without running it again.
func TestLostCommitAnswer(t *testing.T) {
	ctx := context.Background()
	db := outageDB(t)
	var lost atomic.Bool
	postgres.SetCommitFault(db, func(sent bool, err error) error {
		if sent && err == nil && lost.CompareAndSwap(false, true) {
			return io.ErrUnexpectedEOF
		}
		return err
	})
	var runs atomic.Int64
	if err := db.Update(ctx, func(tx store.Tx) error {
		runs.Add(1)
		_, err := tx.Exec(ctx, `INSERT INTO writes (name) VALUES ('once')`)
		return err
	}); err != nil {
		t.Fatalf("Update whose commit answer was lost: %v", err)
	}
	if !lost.Load() || runs.Load() != 1 {
		t.Fatalf("fault fired %v, callback ran %d times; want once", lost.Load(), runs.Load())
	}
	if n := rows(t, db, "once"); n != 1 {
		t.Fatalf("%d rows, want 1", n)
	}
}

// TestCommitCutByServer: the server ends the transaction's connection
// just before its COMMIT (pg_terminate_backend, as a restart does). The
// COMMIT fails with its outcome unknown; the database says the
// transaction was rolled back, so Update runs it again, once.
func TestCommitCutByServer(t *testing.T) {
	ctx := context.Background()
	db := outageDB(t)
	admin, err := pgx.Connect(ctx, pg.AdminURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var pid atomic.Int64
	var cut atomic.Bool
	postgres.SetCommitFault(db, func(sent bool, err error) error {
		if !sent && cut.CompareAndSwap(false, true) {
			if _, terr := admin.Exec(ctx, `SELECT pg_terminate_backend($1::int)`, pid.Load()); terr != nil {
				t.Errorf("terminate: %v", terr)
			}
		}
		return err
	})
	var runs atomic.Int64
	if err := db.Update(ctx, func(tx store.Tx) error {
		runs.Add(1)
		var p int64
		if err := tx.QueryRow(ctx, `SELECT CAST(pg_backend_pid() AS BIGINT)`).Scan(&p); err != nil {
			return err
		}
		pid.Store(p)
		_, err := tx.Exec(ctx, `INSERT INTO writes (name) VALUES ('cut')`)
		return err
	}); err != nil {
		t.Fatalf("Update whose connection was cut before its COMMIT: %v", err)
	}
	if runs.Load() != 2 {
		t.Fatalf("callback ran %d times, want 2 (the cut attempt and its retry)", runs.Load())
	}
	if n := rows(t, db, "cut"); n != 1 {
		t.Fatalf("%d rows, want 1", n)
	}
}
