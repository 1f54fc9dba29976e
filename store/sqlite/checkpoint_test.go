package sqlite_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/sqlite"
)

type checkpointRun struct{ logPages, moved int }

// openCheckpointed opens a database whose background checkpoints are
// timed by a fake clock and reported on the returned channel.
func openCheckpointed(t *testing.T, maxWAL int) (*sqlite.DB, *clockwork.FakeClock, <-chan checkpointRun, string) {
	t.Helper()
	clock := clockwork.NewFakeClock()
	path := filepath.Join(t.TempDir(), "c.db")
	db, err := sqlite.OpenOptions(context.Background(), path, sqlite.Options{Clock: clock, MaxWALPages: maxWAL})
	if err != nil {
		t.Fatal(err)
	}
	runs := make(chan checkpointRun, 16)
	sqlite.SetCheckpointed(db, func(logPages, moved int, err error) {
		if err != nil {
			t.Errorf("checkpoint: %v", err)
		}
		runs <- checkpointRun{logPages, moved}
	})
	t.Cleanup(func() { db.Close() })
	return db, clock, runs, path
}

// createRows creates the table insertPages writes to.
func createRows(t *testing.T, db store.DB) {
	t.Helper()
	ctx := context.Background()
	if err := db.Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// insertPages writes n transactions of one 4 KiB row each: about a page
// of the log apiece.
func insertPages(t *testing.T, db store.DB, n int) {
	t.Helper()
	ctx := context.Background()
	row := strings.Repeat("x", 4000)
	for i := 0; i < n; i++ {
		if err := db.Update(ctx, func(tx store.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO t (v) VALUES (?)`, row)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
}

func walPages(t *testing.T, path string) int {
	t.Helper()
	fi, err := os.Stat(path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	return int(fi.Size() / (4096 + 24))
}

// The writer's commits no longer checkpoint at SQLite's 1,000 pages: the
// background checkpointer does, after a commit and at most once an
// interval, and it moves the whole log.
func TestBackgroundCheckpoint(t *testing.T) {
	ctx := context.Background()
	db, clock, runs, path := openCheckpointed(t, 10000)
	createRows(t, db)
	<-runs // the first commit's checkpoint
	// The checkpointer now waits out its interval on the fake clock: the
	// log grows past SQLite's automatic threshold, unchecked.
	insertPages(t, db, 1500)
	if n := walPages(t, path); n < 1500 {
		t.Fatalf("the log holds %d pages after 1,500 page writes: a commit checkpointed", n)
	}
	if got := db.Stats().Checkpoints; got != 1 {
		t.Fatalf("%d checkpoints before the interval passed, want 1", got)
	}
	if err := clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(100 * time.Millisecond)
	r := <-runs
	if r.logPages < 1500 || r.moved != r.logPages {
		t.Fatalf("checkpoint moved %d of %d pages, want the whole log of at least 1,500", r.moved, r.logPages)
	}
	// The next commit starts the log from its beginning: it stays as long
	// as it was.
	insertPages(t, db, 10)
	if n, m := walPages(t, path), r.logPages; n > m+1 {
		t.Fatalf("the log grew to %d pages after a full checkpoint of %d", n, m)
	}
}

// When the background checkpointer falls behind, the commit that makes the
// log MaxWALPages long checkpoints itself: the log stays bounded.
func TestCheckpointBackstop(t *testing.T) {
	ctx := context.Background()
	db, _, runs, path := openCheckpointed(t, 200)
	createRows(t, db)
	<-runs
	insertPages(t, db, 2000) // the fake clock stands: no background checkpoint
	if n := walPages(t, path); n > 200+10 {
		t.Fatalf("the log holds %d pages, over its bound of 200 (and one commit)", n)
	}
	var n int
	if err := db.View(ctx, func(tx store.Tx) error { return tx.QueryRow(ctx, `SELECT COUNT(*) FROM t`).Scan(&n) }); err != nil || n != 2000 {
		t.Fatalf("rows %d, %v", n, err)
	}
}

// A failing background checkpoint is counted each time, logged once when
// the failures start and once when checkpoints work again.
func TestCheckpointFailuresLogged(t *testing.T) {
	ctx := context.Background()
	clock := clockwork.NewFakeClock()
	var logs testenv.Logs
	db, err := sqlite.OpenOptions(ctx, filepath.Join(t.TempDir(), "f.db"), sqlite.Options{Clock: clock, Logger: logs.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	var failing atomic.Bool
	sqlite.SetCheckpointFault(db, func() error {
		if failing.Load() {
			return errors.New("disk I/O error")
		}
		return nil
	})
	ran := make(chan error, 16)
	sqlite.SetCheckpointed(db, func(_, _ int, err error) { ran <- err })
	createRows(t, db)
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	// round commits a page and lets the checkpointer's interval pass: one
	// checkpoint runs.
	round := func() error {
		insertPages(t, db, 1)
		if err := clock.BlockUntilContext(ctx, 1); err != nil {
			t.Fatal(err)
		}
		clock.Advance(100 * time.Millisecond)
		return <-ran
	}
	failing.Store(true)
	for range 3 {
		if err := round(); err == nil {
			t.Fatal("a faulty checkpoint succeeded")
		}
	}
	failing.Store(false)
	if err := round(); err != nil {
		t.Fatal(err)
	}
	if got := db.Stats().CheckpointErrors; got != 3 {
		t.Fatalf("%d checkpoint errors counted, want 3", got)
	}
	out := logs.String()
	if n := strings.Count(out, "background checkpoint failed"); n != 1 || !strings.Contains(out, "disk I/O error") {
		t.Fatalf("the failures were logged %d times, want once with the error:\n%s", n, out)
	}
	if n := strings.Count(out, "background checkpoints work again"); n != 1 || !strings.Contains(out, "failed=3") {
		t.Fatalf("the recovery was logged %d times, want once with failed=3:\n%s", n, out)
	}
}
