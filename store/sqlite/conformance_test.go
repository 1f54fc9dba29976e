package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/sqlite"
	"github.com/agentry/agentry/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.DB {
		db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "c.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	})
}
