package postgres_test

import (
	"context"
	"fmt"
	"testing"

	"go.uber.org/goleak"

	"github.com/agentry/agentry/internal/testkit/pgtest"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/postgres"
	"github.com/agentry/agentry/store/storetest"
)

var pg pgtest.Cluster

func TestMain(m *testing.M) { goleak.VerifyTestMain(pg.Wrap(m)) }

func open(t *testing.T, opts postgres.Options) *postgres.DB {
	t.Helper()
	db, err := postgres.OpenOptions(context.Background(), pg.URL(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.DB { return open(t, postgres.Options{}) })
}

// TestOwnedTablesShared: the own tables of many instances of a class are
// one physical table (and one view), not one per instance.
func TestOwnedTablesShared(t *testing.T) {
	ctx := context.Background()
	db := open(t, postgres.Options{})
	if err := db.Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `CREATE TABLE instances (id INTEGER PRIMARY KEY AUTOINCREMENT, path TEXT NOT NULL)`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		err := db.Update(ctx, func(tx store.Tx) error {
			var id int64
			if err := tx.QueryRow(ctx, `INSERT INTO instances (path) VALUES (?) RETURNING id`, fmt.Sprint(i)).Scan(&id); err != nil {
				return err
			}
			o := store.OwnedTx(tx, store.Owner{ID: id, Class: "Worker"})
			if _, err := o.Exec(ctx, `CREATE TABLE IF NOT EXISTS {steps} (id INTEGER PRIMARY KEY AUTOINCREMENT, n INTEGER NOT NULL)`); err != nil {
				return err
			}
			_, err := o.Exec(ctx, `INSERT INTO {steps} (n) VALUES (?)`, i)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	var tables, views, rows int
	err := db.View(ctx, func(tx store.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'instances'`).Scan(&tables); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_views WHERE schemaname = 'public'`).Scan(&views); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT count(*) FROM `+postgres.SharedTable("Worker", "steps")).Scan(&rows)
	})
	if err != nil {
		t.Fatal(err)
	}
	if tables != 1 || views != 1 || rows != 50 {
		t.Fatalf("%d tables, %d views, %d rows for 50 instances; want 1, 1, 50", tables, views, rows)
	}
}
