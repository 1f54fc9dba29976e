package storetest

// The fence and owned-table cases: what cluster mode's fencing relies on.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/agentry/agentry/store"
)

// The fence of the context runs after the callback, in its transaction:
// it sees the callback's writes, and its error rolls them back.
func testFence(t *testing.T, db store.DB) {
	bg := context.Background()
	exec(t, db, `CREATE TABLE t (k TEXT PRIMARY KEY)`)
	exec(t, db, `CREATE TABLE lease (shard BIGINT PRIMARY KEY, epoch BIGINT NOT NULL)`)
	exec(t, db, `INSERT INTO lease (shard, epoch) VALUES (1, 7)`)
	lost := errors.New("lease lost")
	fence := func(held int64) store.Fence {
		return func(ctx context.Context, tx store.Tx) error {
			var seen int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&seen); err != nil {
				return err
			}
			if seen == 0 {
				return errors.New("the fence ran before the callback's writes")
			}
			var epoch int64
			if err := tx.QueryRow(ctx, `SELECT epoch FROM lease WHERE shard = 1 FOR SHARE`).Scan(&epoch); err != nil {
				return err
			}
			if epoch != held {
				return lost
			}
			return nil
		}
	}
	ins := func(ctx context.Context, k string) error {
		return db.Update(ctx, func(tx store.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO t (k) VALUES (?)`, k)
			return err
		})
	}
	if err := ins(store.WithFence(bg, fence(7)), "held"); err != nil {
		t.Fatal(err)
	}
	if err := ins(store.WithFence(bg, fence(6)), "stale"); !errors.Is(err, lost) {
		t.Fatalf("a stale epoch's write returned %v", err)
	}
	// Fences compose: both run.
	ctx := store.WithFence(store.WithFence(bg, fence(7)), func(context.Context, store.Tx) error { return lost })
	if err := ins(ctx, "second"); !errors.Is(err, lost) {
		t.Fatalf("the second fence did not run: %v", err)
	}
	if n := count(t, db, `SELECT count(*) FROM t`); n != 1 {
		t.Fatalf("%d rows, want only the fenced-in one", n)
	}
}

// After Close, Update and View fail and do not run their callbacks.
func testClosed(t *testing.T, db store.DB) {
	ctx := context.Background()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	ran := false
	if err := db.Update(ctx, func(store.Tx) error { ran = true; return nil }); err == nil || ran {
		t.Fatalf("Update after Close: %v, ran %v", err, ran)
	}
	if err := db.View(ctx, func(store.Tx) error { ran = true; return nil }); err == nil || ran {
		t.Fatalf("View after Close: %v, ran %v", err, ran)
	}
}

// ownedInstances creates the instances table owned tables hang off (as
// package agent's does) and n rows in it.
func ownedInstances(t *testing.T, db store.DB, n int) []int64 {
	t.Helper()
	ctx := context.Background()
	exec(t, db, `CREATE TABLE IF NOT EXISTS instances (id INTEGER PRIMARY KEY AUTOINCREMENT, path TEXT NOT NULL)`)
	var ids []int64
	for i := range n {
		err := db.Update(ctx, func(tx store.Tx) error {
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO instances (path) VALUES (?) RETURNING id`, fmt.Sprint("i", i)).Scan(&id)
			ids = append(ids, id)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

func owned(t *testing.T, db store.DB, o store.Owner, fn func(ctx context.Context, tx store.Tx) error) {
	t.Helper()
	ctx := context.Background()
	if err := db.Update(ctx, func(tx store.Tx) error { return fn(ctx, store.OwnedTx(tx, o)) }); err != nil {
		t.Fatalf("owner %d: %v", o.ID, err)
	}
}

func ownedCount(t *testing.T, db store.DB, o store.Owner, q string, args ...any) int64 {
	t.Helper()
	ctx := context.Background()
	var n int64
	if err := db.View(ctx, func(tx store.Tx) error { return store.OwnedTx(tx, o).QueryRow(ctx, q, args...).Scan(&n) }); err != nil {
		t.Fatalf("owner %d: %s: %v", o.ID, q, err)
	}
	return n
}

// An instance's own tables ({name}) are private to it: same names and keys
// in other instances (of the same class or another) do not collide, every
// statement sees and touches only its rows, added columns and references
// work, and DropOwned removes one instance's table alone.
func testOwnedTables(t *testing.T, db store.DB) {
	ids := ownedInstances(t, db, 3)
	a, b, c := store.Owner{ID: ids[0], Class: "Notes"}, store.Owner{ID: ids[1], Class: "Notes"}, store.Owner{ID: ids[2], Class: "Other"}
	for _, o := range []store.Owner{a, b} {
		owned(t, db, o, func(ctx context.Context, tx store.Tx) error {
			if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS {notes} (
				id INTEGER PRIMARY KEY AUTOINCREMENT,
				k TEXT NOT NULL UNIQUE,
				v TEXT)`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS {tags} (
				note_id INTEGER NOT NULL REFERENCES {notes}(id) ON DELETE CASCADE,
				tag TEXT NOT NULL,
				PRIMARY KEY (note_id, tag))`)
			return err
		})
	}
	// Another class's table of the same name has its own columns.
	owned(t, db, c, func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS {notes} (title TEXT PRIMARY KEY)`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO {notes} (title) VALUES (?)`, "other")
		return err
	})
	for i, o := range []store.Owner{a, b} {
		owned(t, db, o, func(ctx context.Context, tx store.Tx) error {
			for _, k := range []string{"x", "y", "z"} {
				if _, err := tx.Exec(ctx, `INSERT INTO {notes} (k, v) VALUES (?, ?)
					ON CONFLICT (k) DO UPDATE SET v = excluded.v`, k, fmt.Sprint("first", i)); err != nil {
					return err
				}
			}
			if _, err := tx.Exec(ctx, `INSERT INTO {notes} (k, v) VALUES (?, ?)
				ON CONFLICT (k) DO UPDATE SET v = {notes}.v || '+' || excluded.v`, "x", "again"); err != nil {
				return err
			}
			var id int64
			if err := tx.QueryRow(ctx, `INSERT INTO {notes} (k, v) VALUES (?, ?) RETURNING id`, "w", "new").Scan(&id); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO {tags} (note_id, tag) SELECT id, 'all' FROM {notes}`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `DELETE FROM {notes} WHERE k = ?`, "z") // its tag goes with it
			return err
		})
	}
	owned(t, db, a, func(ctx context.Context, tx store.Tx) error {
		res, err := tx.Exec(ctx, `UPDATE {notes} SET v = 'only a'`)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 3 {
			return fmt.Errorf("UPDATE touched %d rows, want a's 3", n)
		}
		return nil
	})
	for _, o := range []store.Owner{a, b} {
		if n := ownedCount(t, db, o, `SELECT count(*) FROM {notes}`); n != 3 {
			t.Fatalf("owner %d sees %d notes, want 3", o.ID, n)
		}
		if n := ownedCount(t, db, o, `SELECT count(*) FROM {tags} JOIN {notes} ON {notes}.id = {tags}.note_id`); n != 3 {
			t.Fatalf("owner %d sees %d tags, want 3", o.ID, n)
		}
	}
	if n := ownedCount(t, db, b, `SELECT count(*) FROM {notes} WHERE v = 'only a'`); n != 0 {
		t.Fatal("a's UPDATE reached b's rows")
	}
	if n := ownedCount(t, db, b, `SELECT count(*) FROM {notes} WHERE k = 'x' AND v = 'first1+again'`); n != 1 {
		t.Fatal("the upsert did not update b's row")
	}
	if n := ownedCount(t, db, c, `SELECT count(*) FROM {notes} WHERE title = 'other'`); n != 1 {
		t.Fatal("the other class's table lost its row")
	}
	// An added column, by each instance in turn.
	for _, o := range []store.Owner{a, b} {
		owned(t, db, o, func(ctx context.Context, tx store.Tx) error {
			if _, err := tx.Exec(ctx, `ALTER TABLE {notes} ADD COLUMN extra INTEGER`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE {notes} SET extra = ? WHERE k = ?`, o.ID, "x")
			return err
		})
	}
	if n := ownedCount(t, db, a, `SELECT extra FROM {notes} WHERE k = 'x'`); n != a.ID {
		t.Fatalf("a's extra = %d", n)
	}
	// Dropping a's tables leaves b's.
	ctx := context.Background()
	if err := db.Update(ctx, func(tx store.Tx) error {
		if err := store.DropOwned(ctx, tx, a, "tags"); err != nil {
			return err
		}
		return store.DropOwned(ctx, tx, a, "notes")
	}); err != nil {
		t.Fatal(err)
	}
	if n := ownedCount(t, db, b, `SELECT count(*) FROM {notes}`); n != 3 {
		t.Fatalf("b has %d notes after a's table was dropped", n)
	}
	owned(t, db, a, func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS {notes} (id INTEGER PRIMARY KEY AUTOINCREMENT, k TEXT NOT NULL UNIQUE, v TEXT, extra INTEGER)`); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM {notes}`).Scan(&n); err != nil {
			return err
		}
		if n != 0 {
			return fmt.Errorf("a's recreated table holds %d rows", n)
		}
		return nil
	})
}

// Many instances creating the same table at once all succeed.
func testOwnedConcurrentCreate(t *testing.T, db store.DB) {
	ids := ownedInstances(t, db, 12)
	var wg sync.WaitGroup
	errs := make(chan error, len(ids))
	for _, id := range ids {
		wg.Go(func() {
			ctx := context.Background()
			errs <- db.Update(ctx, func(tx store.Tx) error {
				o := store.OwnedTx(tx, store.Owner{ID: id, Class: "Crowd"})
				if _, err := o.Exec(ctx, `CREATE TABLE IF NOT EXISTS {steps} (id INTEGER PRIMARY KEY AUTOINCREMENT, n INTEGER NOT NULL)`); err != nil {
					return err
				}
				_, err := o.Exec(ctx, `INSERT INTO {steps} (n) VALUES (?)`, id)
				return err
			})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range ids {
		o := store.Owner{ID: id, Class: "Crowd"}
		if n := ownedCount(t, db, o, `SELECT count(*) FROM {steps} WHERE n = ?`, id); n != 1 {
			t.Fatalf("instance %d sees %d of its steps", id, n)
		}
		if n := ownedCount(t, db, o, `SELECT count(*) FROM {steps}`); n != 1 {
			t.Fatalf("instance %d sees %d steps", id, n)
		}
	}
}
