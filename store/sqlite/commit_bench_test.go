package sqlite_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/sqlite"
)

// BenchmarkCommitPages measures one write transaction that inserts a row
// into each of pages tables (so it dirties about that many pages, each one
// frame of the write-ahead log), one transaction at a time: what a commit
// costs with its pages. The same=true runs insert as many rows into one
// table (the same statements, one page): the difference between the two
// is what the pages cost, the same=true slope what the statements cost.
//
//	go test -run '^$' -bench CommitPages ./store/sqlite/
func BenchmarkCommitPages(b *testing.B) {
	for _, same := range []bool{false, true} {
		for _, pages := range []int{1, 10, 40} {
			b.Run(fmt.Sprintf("pages=%d/same=%v", pages, same), func(b *testing.B) { benchCommitPages(b, pages, same) })
		}
	}
}

func benchCommitPages(b *testing.B, pages int, same bool) {
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "c.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	err = db.Update(ctx, func(tx store.Tx) error {
		for i := range pages {
			if _, err := tx.Exec(ctx, fmt.Sprintf(`CREATE TABLE t%d (id INTEGER PRIMARY KEY, v TEXT NOT NULL)`, i)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	inserts := make([]string, pages)
	for i := range inserts {
		t := i
		if same {
			t = 0
		}
		inserts[i] = fmt.Sprintf(`INSERT INTO t%d (v) VALUES (?)`, t)
	}
	b.ResetTimer()
	for range b.N {
		err := db.Update(ctx, func(tx store.Tx) error {
			for _, q := range inserts {
				if _, err := tx.Exec(ctx, q, "0123456789abcdef"); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}
