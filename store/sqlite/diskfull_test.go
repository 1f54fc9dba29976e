package sqlite_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/sqlite"
)

// fillDisk makes every write of this process to a regular file fail, as a
// full disk does, and returns the function that gives the space back. It
// lowers the soft file size limit (RLIMIT_FSIZE) to zero: the kernel then
// refuses each write() with EFBIG, which SQLite reports as an I/O error,
// the error a full or failing disk gives it. (The Go runtime ignores the
// SIGXFSZ that comes with it.) No root is needed, and SQLite's own code
// meets the fault, which an injected error would skip; a read-only chmod
// would not do, since the open files stay writable. The test must not run
// in parallel with others: the limit is the whole process's.
func fillDisk(t *testing.T) (free func()) {
	t.Helper()
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: 0, Max: old.Max}); err != nil {
		t.Fatal(err)
	}
	freed := false
	free = func() {
		if !freed {
			freed = true
			if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &old); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(free)
	return free
}

// TestFullDiskWaitsAndRecovers (issue 24, item 5): while the disk refuses
// writes, an Update with a retry limit (a client's request) fails with
// store.ErrUnavailable and leaves nothing behind, reads go on, and an
// Update without one (work on a run's path) waits; once the space is back
// it commits, once, without a restart, and the database is intact.
func TestFullDiskWaitsAndRecovers(t *testing.T) {
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "full.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	insert := func(ctx context.Context, name string) error {
		return db.Update(ctx, func(tx store.Tx) error {
			// Two statements: a transaction that fails leaves neither.
			if _, err := tx.Exec(ctx, `INSERT INTO runs (name) VALUES (?)`, name); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO chunks (name, body) VALUES (?, ?)`, name, "a chunk of the run")
			return err
		})
	}
	count := func(table, name string) int {
		var n int
		if err := db.View(ctx, func(tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT COUNT(*) FROM `+table+` WHERE name = ?`, name).Scan(&n)
		}); err != nil {
			t.Fatalf("read while the disk is full: %v", err)
		}
		return n
	}
	if err := db.Update(ctx, func(tx store.Tx) error {
		for _, q := range []string{`CREATE TABLE runs (name TEXT NOT NULL)`, `CREATE TABLE chunks (name TEXT NOT NULL, body TEXT NOT NULL)`} {
			if _, err := tx.Exec(ctx, q); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := insert(ctx, "before"); err != nil {
		t.Fatal(err)
	}

	free := fillDisk(t)
	err = insert(store.WithRetryLimit(ctx, 50*time.Millisecond), "refused")
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("a write on a full disk: %v, want store.ErrUnavailable", err)
	}
	if n := count("runs", "before"); n != 1 {
		t.Fatalf("read on a full disk: %d rows, want 1", n)
	}
	from := db.Stats().DiskRefused
	waited := make(chan error, 1)
	go func() { waited <- insert(ctx, "waited") }()
	deadline := time.Now().Add(30 * time.Second)
	for db.Stats().DiskRefused < from+2 {
		select {
		case err := <-waited:
			t.Fatalf("the write made while the disk was full ended before the space came back: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the write does not retry")
		}
		time.Sleep(time.Millisecond)
	}
	free()
	if err := <-waited; err != nil {
		t.Fatalf("the write made while the disk was full, once space came back: %v", err)
	}
	for _, c := range []struct {
		table, name string
		want        int
	}{{"runs", "refused", 0}, {"chunks", "refused", 0}, {"runs", "waited", 1}, {"chunks", "waited", 1}} {
		if n := count(c.table, c.name); n != c.want {
			t.Errorf("%s rows of %q: %d, want %d", c.table, c.name, n, c.want)
		}
	}
	if err := insert(ctx, "after"); err != nil {
		t.Fatalf("a write after the space came back: %v", err)
	}
	var check string
	if err := db.View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `PRAGMA integrity_check`).Scan(&check)
	}); err != nil || check != "ok" {
		t.Fatalf("integrity_check: %q %v", check, err)
	}
}
