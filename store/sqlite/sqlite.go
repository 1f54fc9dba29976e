// Package sqlite implements store.DB on SQLite through the pure-Go driver
// modernc.org/sqlite: one database file in WAL mode with synchronous=NORMAL,
// a single writer connection (so writers queue in Go rather than spin on
// SQLITE_BUSY) and a small pool of readers.
package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"

	"github.com/agentry/agentry/store"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// DB is a store.DB backed by one SQLite file.
type DB struct {
	writer *sql.DB
	reader *sql.DB
	path   string
}

var _ store.DB = (*DB)(nil)

// Open opens (creating if needed) the database at path. A path of ":memory:"
// is not supported, since readers and the writer must share one database;
// use a file in a temporary folder instead.
func Open(ctx context.Context, path string) (*DB, error) {
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("sqlite: create data folder: %w", err)
		}
	}
	pragmas := url.Values{}
	for _, p := range []string{
		"journal_mode(WAL)",
		"synchronous(NORMAL)",
		"busy_timeout(10000)",
		"foreign_keys(ON)",
		"temp_store(MEMORY)",
	} {
		pragmas.Add("_pragma", p)
	}
	writerDSN := "file:" + path + "?" + pragmas.Encode() + "&_txlock=immediate"
	readerDSN := "file:" + path + "?" + pragmas.Encode() + "&mode=ro"

	writer, err := sql.Open("sqlite", writerDSN)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	writer.SetMaxOpenConns(1)
	writer.SetMaxIdleConns(1)
	writer.SetConnMaxLifetime(0)
	if err := writer.PingContext(ctx); err != nil {
		writer.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	reader, err := sql.Open("sqlite", readerDSN)
	if err != nil {
		writer.Close()
		return nil, fmt.Errorf("sqlite: open %s for reading: %w", path, err)
	}
	n := max(2, runtime.GOMAXPROCS(0))
	reader.SetMaxOpenConns(n)
	reader.SetMaxIdleConns(n)
	return &DB{writer: writer, reader: reader, path: path}, nil
}

// Path returns the database file's path.
func (db *DB) Path() string { return db.path }

// Dialect returns "sqlite".
func (db *DB) Dialect() string { return "sqlite" }

// Update runs fn in a write transaction (BEGIN IMMEDIATE) and commits it.
func (db *DB) Update(ctx context.Context, fn func(store.Tx) error) error {
	return runTx(ctx, db.writer, false, fn)
}

// View runs fn in a read-only transaction on a reader connection.
func (db *DB) View(ctx context.Context, fn func(store.Tx) error) error {
	return runTx(ctx, db.reader, true, fn)
}

func runTx(ctx context.Context, pool *sql.DB, readOnly bool, fn func(store.Tx) error) (err error) {
	tx, err := pool.BeginTx(ctx, &sql.TxOptions{ReadOnly: readOnly})
	if err != nil {
		return fmt.Errorf("sqlite: begin: %w", err)
	}
	defer func() {
		if p := recover(); p != nil {
			tx.Rollback()
			panic(p)
		}
	}()
	if err := fn(txn{tx}); err != nil {
		tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlite: commit: %w", err)
	}
	return nil
}

// Close closes both connection pools.
func (db *DB) Close() error {
	rerr := db.reader.Close()
	werr := db.writer.Close()
	if werr != nil {
		return fmt.Errorf("sqlite: close: %w", werr)
	}
	if rerr != nil {
		return fmt.Errorf("sqlite: close: %w", rerr)
	}
	return nil
}

type txn struct{ tx *sql.Tx }

func (t txn) Exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return t.tx.ExecContext(ctx, q, args...)
}

func (t txn) Query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return t.tx.QueryContext(ctx, q, args...)
}

func (t txn) QueryRow(ctx context.Context, q string, args ...any) *sql.Row {
	return t.tx.QueryRowContext(ctx, q, args...)
}
