package sqlite_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/sqlite"
)

func TestMain(m *testing.M) {
	if path := os.Getenv(crashEnv); path != "" {
		crashHelper(path) // never returns
	}
	goleak.VerifyTestMain(m)
}

func open(t *testing.T, path string) *sqlite.DB {
	t.Helper()
	db, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func count(t *testing.T, db store.DB, q string, args ...any) int {
	t.Helper()
	ctx := context.Background()
	var n int
	if err := db.View(ctx, func(tx store.Tx) error { return tx.QueryRow(ctx, q, args...).Scan(&n) }); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// Update commits on nil, rolls back on error and on panic; committed data
// survives closing and reopening the file; View cannot write.
func TestTransactions(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "nested", "dir", "x.db") // folders are created
	db := open(t, path)
	if db.Dialect() != "sqlite" || db.Path() != path {
		t.Fatalf("Dialect %q Path %q", db.Dialect(), db.Path())
	}
	err := db.Update(ctx, func(tx store.Tx) error {
		if _, err := tx.Exec(ctx, `CREATE TABLE t (k TEXT PRIMARY KEY, v BIGINT)`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO t (k, v) VALUES (?, ?)`, "a", 1)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	boom := errors.New("boom")
	err = db.Update(ctx, func(tx store.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO t (k, v) VALUES (?, ?)`, "b", 2); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Update returned %v, want the callback's error", err)
	}
	if n := count(t, db, `SELECT count(*) FROM t WHERE k = ?`, "b"); n != 0 {
		t.Fatal("a failed transaction was committed")
	}

	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic was swallowed")
			}
		}()
		db.Update(ctx, func(tx store.Tx) error {
			tx.Exec(ctx, `INSERT INTO t (k, v) VALUES (?, ?)`, "c", 3)
			panic("oops")
		})
	}()
	if n := count(t, db, `SELECT count(*) FROM t WHERE k = ?`, "c"); n != 0 {
		t.Fatal("a panicking transaction was committed")
	}
	// The writer is usable after the panic (its transaction was released).
	if err := db.Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO t (k, v) VALUES (?, ?)`, "d", 4)
		return err
	}); err != nil {
		t.Fatal(err)
	}

	err = db.View(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO t (k, v) VALUES (?, ?)`, "e", 5)
		return err
	})
	if err == nil {
		t.Fatal("View allowed a write")
	}

	// RETURNING and ON CONFLICT, the portable subset the runtime uses.
	var v int
	err = db.Update(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `INSERT INTO t (k, v) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = t.v + excluded.v RETURNING v`, "a", 10).Scan(&v)
	})
	if err != nil || v != 11 {
		t.Fatalf("upsert returned %d, %v", v, err)
	}

	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db2 := open(t, path)
	if n := count(t, db2, `SELECT count(*) FROM t`); n != 2 {
		t.Fatalf("%d rows after reopening, want 2 (a, d)", n)
	}
}

// The database runs in WAL mode with foreign keys enforced (the runtime
// relies on ON DELETE CASCADE).
func TestPragmas(t *testing.T) {
	ctx := context.Background()
	db := open(t, filepath.Join(t.TempDir(), "p.db"))
	var mode string
	if err := db.View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `PRAGMA journal_mode`).Scan(&mode)
	}); err != nil || strings.ToLower(mode) != "wal" {
		t.Fatalf("journal_mode = %q, %v", mode, err)
	}
	err := db.Update(ctx, func(tx store.Tx) error {
		for _, q := range []string{
			`CREATE TABLE parent (id INTEGER PRIMARY KEY)`,
			`CREATE TABLE child (id INTEGER PRIMARY KEY, parent_id INTEGER REFERENCES parent(id) ON DELETE CASCADE)`,
			`INSERT INTO parent (id) VALUES (1)`,
			`INSERT INTO child (id, parent_id) VALUES (1, 1)`,
			`DELETE FROM parent WHERE id = 1`,
		} {
			if _, err := tx.Exec(ctx, q); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, `SELECT count(*) FROM child`); n != 0 {
		t.Fatal("ON DELETE CASCADE did not run: foreign keys are off")
	}
	err = db.Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO child (id, parent_id) VALUES (2, 99)`)
		return err
	})
	if err == nil {
		t.Fatal("a dangling foreign key was accepted")
	}
}

// Migrate runs each version once, in order, records the version per
// component, and rolls a failing step back entirely.
func TestMigrate(t *testing.T) {
	ctx := context.Background()
	db := open(t, filepath.Join(t.TempDir(), "m.db"))
	v1 := []store.Migration{{Version: 1, Statements: []string{`CREATE TABLE a (x INTEGER)`}}}
	for range 2 {
		if err := store.Migrate(ctx, db, "comp", v1); err != nil {
			t.Fatalf("migrate v1 (twice must be a no-op): %v", err)
		}
	}
	v2 := append(v1, store.Migration{Version: 2, Statements: []string{`ALTER TABLE a ADD COLUMN y INTEGER`}})
	if err := store.Migrate(ctx, db, "comp", v2); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, `SELECT version FROM schema_versions WHERE component = ?`, "comp"); n != 2 {
		t.Fatalf("recorded version %d, want 2", n)
	}
	bad := append(v2, store.Migration{Version: 3, Statements: []string{
		`CREATE TABLE b (x INTEGER)`,
		`THIS IS NOT SQL`,
	}})
	if err := store.Migrate(ctx, db, "comp", bad); err == nil {
		t.Fatal("a failing migration succeeded")
	}
	if n := count(t, db, `SELECT count(*) FROM sqlite_master WHERE name = 'b'`); n != 0 {
		t.Fatal("a failing migration step was partly applied")
	}
	if n := count(t, db, `SELECT version FROM schema_versions WHERE component = ?`, "comp"); n != 2 {
		t.Fatalf("version after a failed step = %d, want 2", n)
	}
	// Another component has its own version.
	if err := store.Migrate(ctx, db, "other", []store.Migration{{Version: 1, Statements: []string{`CREATE TABLE c (x INTEGER)`}}}); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, `SELECT count(*) FROM schema_versions`); n != 2 {
		t.Fatalf("%d components recorded, want 2", n)
	}
}

// Readers see committed writes while a write transaction is open (WAL):
// a View does not block on a long Update.
func TestReadersDoNotBlockOnWriter(t *testing.T) {
	ctx := context.Background()
	db := open(t, filepath.Join(t.TempDir(), "r.db"))
	if err := db.Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `CREATE TABLE t (x INTEGER)`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	inside := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- db.Update(ctx, func(tx store.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO t (x) VALUES (1)`); err != nil {
				return err
			}
			close(inside)
			<-release
			return nil
		})
	}()
	<-inside
	if n := count(t, db, `SELECT count(*) FROM t`); n != 0 {
		t.Errorf("reader saw an uncommitted row")
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, `SELECT count(*) FROM t`); n != 1 {
		t.Errorf("reader does not see the committed row")
	}
}

// TestMigrateTwoProcesses: two handles on one file (as two processes that
// start at once) migrate the same component concurrently; each step runs
// once (its non-idempotent INSERT leaves one row per step), both succeed,
// and the recorded version is the last step's.
func TestMigrateTwoProcesses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agentry.db")
	a, b := open(t, path), open(t, path)
	steps := []store.Migration{
		{Version: 1, Statements: []string{
			`CREATE TABLE IF NOT EXISTS applied (step INTEGER NOT NULL)`,
			`INSERT INTO applied (step) VALUES (1)`}},
		{Version: 2, Statements: []string{`INSERT INTO applied (step) VALUES (2)`}},
	}
	for round := range 20 {
		comp := "race" + string(rune('a'+round))
		steps[0].Statements[0] = `CREATE TABLE IF NOT EXISTS applied_` + comp + ` (step INTEGER NOT NULL)`
		steps[0].Statements[1] = `INSERT INTO applied_` + comp + ` (step) VALUES (1)`
		steps[1].Statements[0] = `INSERT INTO applied_` + comp + ` (step) VALUES (2)`
		errs := make(chan error, 2)
		for _, db := range []*sqlite.DB{a, b} {
			go func() { errs <- store.Migrate(context.Background(), db, comp, steps) }()
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if n := count(t, a, `SELECT COUNT(*) FROM applied_`+comp); n != 2 {
			t.Fatalf("round %d: %d steps applied, want 2 (each once)", round, n)
		}
		if v := count(t, b, `SELECT version FROM schema_versions WHERE component = ?`, comp); v != 2 {
			t.Fatalf("round %d: version %d, want 2", round, v)
		}
	}
}
