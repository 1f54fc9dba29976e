// Package store defines the storage interface that Agentry's runtime and its
// framework layers (chat, agent tools) are written against.
//
// A DB runs portable SQL: statements use "?" placeholders and the subset of
// SQL that SQLite and PostgreSQL share (INSERT … ON CONFLICT, RETURNING,
// BIGINT time stamps in Unix milliseconds, TEXT for JSON, INTEGER PRIMARY
// KEY AUTOINCREMENT for a numbered row). Implementations rewrite it for
// their engine, so packages above this one keep their SQL next to the code
// that uses it and never see the dialect.
//
// Write transactions may run concurrently (PostgreSQL) or one at a time
// (SQLite); code must be correct either way. A read that decides a write
// takes a row lock first: a SELECT may end with FOR UPDATE or FOR SHARE
// (SQLite, whose write transactions hold the whole database, drops the
// clause). Terminal transitions are single guarded statements whose
// affected-row count decides the winner.
//
// An instance's own tables ({name} in its SQL) are reached through
// OwnedTx, which lets each engine keep them its own way; a transaction
// can be fenced (WithFence) by a check that runs just before its commit.
// The conformance suite store/storetest pins down what every DB does.
//
// Implementations: store/sqlite (the default, pure Go) and store/postgres
// (cluster mode, on pgx).
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// DB is a transactional database shared by all agent instances.
type DB interface {
	// Update runs fn in a read-write transaction and commits it when fn
	// returns nil; it returns once the commit is durable (a committed
	// transaction survives a crash of the process), or fn's error with
	// fn's writes rolled back. An implementation may commit several
	// concurrent Update transactions together (store/sqlite does), each
	// still all or nothing. fn may hold the single writer (store/sqlite):
	// it must not call Update itself, nor wait for anything that waits for
	// the writer. fn may run more than once (store/postgres runs it again
	// after a serialization failure or a deadlock), so its effects outside
	// the transaction must be ones a second run redoes harmlessly, such as
	// assigning its results.
	Update(ctx context.Context, fn func(Tx) error) error
	// View runs fn in a read-only transaction whose statements all see
	// one snapshot: a write that commits meanwhile is not seen by them.
	View(ctx context.Context, fn func(Tx) error) error
	// Dialect names the SQL engine ("sqlite", "postgres").
	Dialect() string
	// Close releases the database.
	Close() error
}

// Tx is a transaction. Queries use "?" placeholders.
type Tx interface {
	Exec(ctx context.Context, query string, args ...any) (sql.Result, error)
	Query(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRow(ctx context.Context, query string, args ...any) *sql.Row
}

// ErrNotFound is returned when a looked-up row does not exist.
var ErrNotFound = errors.New("store: not found")

// Migration is one versioned step of a package's schema.
type Migration struct {
	// Version orders the steps of one component, starting at 1.
	Version int
	// Statements run in order inside one transaction.
	Statements []string
}

// ErrSchemaTooNew is the error (wrapped in a *SchemaTooNewError) of
// CheckSchemas when the database holds a component's schema at
// a version newer than the code knows: a newer build migrated it. The code
// refuses to run on it rather than guess what the newer steps changed.
var ErrSchemaTooNew = errors.New("store: database schema is newer than this build")

// SchemaTooNewError names the component whose recorded schema version is
// newer than the newest migration the code knows.
type SchemaTooNewError struct {
	Component string // "agent", "chat", "agenttool", …
	Version   int    // recorded in the database's schema_versions table
	Known     int    // the newest version this build has
}

func (e *SchemaTooNewError) Error() string {
	return fmt.Sprintf("store: the database's %q schema is at version %d, newer than this build knows (%d): "+
		"a newer Agentry version migrated it; run that version or newer (docs/cluster.md, \"Upgrading\")",
		e.Component, e.Version, e.Known)
}

// Unwrap returns ErrSchemaTooNew.
func (e *SchemaTooNewError) Unwrap() error { return ErrSchemaTooNew }

// CheckSchemas returns a *SchemaTooNewError when the database records a
// schema version newer than known gives for that component (components
// known does not name are not checked). A process calls it before it
// takes part in anything, so that a build older than the database refuses
// to start instead of failing on first use.
func CheckSchemas(ctx context.Context, db DB, known map[string]int) error {
	err := db.Update(ctx, func(tx Tx) error {
		if err := createVersions(ctx, db, tx); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT component, version FROM schema_versions`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var c string
			var v int
			if err := rows.Scan(&c, &v); err != nil {
				return err
			}
			if k, ok := known[c]; ok && v > k {
				return &SchemaTooNewError{Component: c, Version: v, Known: k}
			}
		}
		return rows.Err()
	})
	if err != nil && !errors.Is(err, ErrSchemaTooNew) {
		return fmt.Errorf("store: check schema versions: %w", err)
	}
	return err
}

// createVersions creates the schema_versions table if it is missing. On
// PostgreSQL it takes the schema's advisory lock first: two transactions
// that create one table at once fail (a unique violation in the catalog),
// and it keeps concurrent Migrate calls one at a time.
func createVersions(ctx context.Context, db DB, tx Tx) error {
	if db.Dialect() == "postgres" {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(?)`, int64(0x6167656e747279)); err != nil {
			return err
		}
	}
	_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_versions (
		component TEXT PRIMARY KEY,
		version BIGINT NOT NULL)`)
	return err
}

// Migrate brings the schema of component (a package name such as "agent" or
// "chat") up to date by running the migrations newer than the recorded
// version. All of it is one write transaction, so two processes that start
// on one database at once never both run a step: on SQLite the write
// transaction (BEGIN IMMEDIATE) is the lock, on PostgreSQL a transaction
// advisory lock is taken first. A schema recorded at a version newer than
// the last of migrations (a newer build migrated it while this process
// ran) is left as it is: migrations are additive, so a process that
// started on the older schema goes on; a process refuses to start on it
// by calling CheckSchemas first.
func Migrate(ctx context.Context, db DB, component string, migrations []Migration) error {
	err := db.Update(ctx, func(tx Tx) error {
		if err := createVersions(ctx, db, tx); err != nil {
			return err
		}
		var current int
		err := tx.QueryRow(ctx, `SELECT version FROM schema_versions WHERE component = ?`, component).Scan(&current)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		applied := current
		for _, m := range migrations {
			if m.Version <= current {
				continue
			}
			for _, stmt := range m.Statements {
				if _, err := tx.Exec(ctx, stmt); err != nil {
					return fmt.Errorf("version %d: %w", m.Version, err)
				}
			}
			applied = m.Version
		}
		if applied == current {
			return nil
		}
		_, err = tx.Exec(ctx, `INSERT INTO schema_versions (component, version) VALUES (?, ?)
			ON CONFLICT (component) DO UPDATE SET version = excluded.version`, component, applied)
		return err
	})
	if err != nil {
		return fmt.Errorf("store: migrate %s: %w", component, err)
	}
	return nil
}

// LatestVersion is the highest Version of migrations (0 for none).
func LatestVersion(migrations []Migration) int {
	v := 0
	for _, m := range migrations {
		v = max(v, m.Version)
	}
	return v
}
