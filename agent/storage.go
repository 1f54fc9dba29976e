package agent

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/agentry/agentry/store"
)

// Storage is an instance's own durable storage: a key-value store (Get,
// Put, Delete, Keys) and SQL tables private to the instance (Update, View).
// Get it with Base.Storage. It lives on its own type, not on Base, so that
// generic names such as "get" and "update" stay free for an agent's own
// callable methods.
type Storage struct {
	in *instance
}

// Storage returns the instance's durable storage.
func (b *Base) Storage() Storage { return Storage{in: b.in} }

// Get reads the value stored under key into v and reports whether it
// existed.
func (b Storage) Get(ctx context.Context, key string, v any) (bool, error) {
	var raw string
	err := b.in.rt.db.View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT value FROM kv WHERE instance_id = ? AND key = ?`, b.in.id, key).Scan(&raw)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("agent: get %q: %w", key, err)
	}
	if err := json.Unmarshal([]byte(raw), v); err != nil {
		return true, fmt.Errorf("agent: decode %q: %w", key, err)
	}
	return true, nil
}

// Put stores v as JSON under key. It returns once the value is durable.
func (b Storage) Put(ctx context.Context, key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("agent: marshal %q: %w", key, err)
	}
	err = b.in.db().Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO kv (instance_id, key, value) VALUES (?, ?, ?)
			ON CONFLICT (instance_id, key) DO UPDATE SET value = excluded.value`, b.in.id, key, string(data))
		return err
	})
	if err != nil {
		return fmt.Errorf("agent: put %q: %w", key, err)
	}
	return nil
}

// Delete removes key.
func (b Storage) Delete(ctx context.Context, key string) error {
	err := b.in.db().Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `DELETE FROM kv WHERE instance_id = ? AND key = ?`, b.in.id, key)
		return err
	})
	if err != nil {
		return fmt.Errorf("agent: delete %q: %w", key, err)
	}
	return nil
}

// Keys returns the stored keys that start with prefix, in order.
func (b Storage) Keys(ctx context.Context, prefix string) ([]string, error) {
	var keys []string
	err := b.in.rt.db.View(ctx, func(tx store.Tx) error {
		rows, err := tx.Query(ctx, `SELECT key FROM kv WHERE instance_id = ? AND key >= ? ORDER BY key`, b.in.id, prefix)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				return err
			}
			if !strings.HasPrefix(k, prefix) {
				break
			}
			keys = append(keys, k)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("agent: list keys: %w", err)
	}
	return keys, nil
}

// SQL is a transaction over the instance's own tables. In every statement a
// table name written in braces, such as {extraction_runs}, names a table that
// belongs to this instance alone: it is private to the instance and dropped
// when the instance is destroyed. Placeholders are "?". Write portable SQL
// (the subset SQLite and PostgreSQL share) so the agent runs on either; how
// each engine keeps the tables (one per instance on SQLite, shared tables
// keyed by instance on PostgreSQL) is the store's business (store.OwnedTx).
type SQL struct {
	ctx context.Context
	tx  store.Tx // owned: {name} resolves to the instance's tables
	raw store.Tx
	id  int64
}

var createTable = regexp.MustCompile(`(?i)^\s*CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?\{([A-Za-z_][A-Za-z0-9_]*)\}`)

func newSQL(ctx context.Context, tx store.Tx, in *instance) *SQL {
	return &SQL{ctx: ctx, raw: tx, id: in.id, tx: store.OwnedTx(tx, store.Owner{ID: in.id, Class: in.class.Name})}
}

// Exec runs a statement.
func (s *SQL) Exec(query string, args ...any) (sql.Result, error) {
	if m := createTable.FindStringSubmatch(query); m != nil {
		if _, err := s.raw.Exec(s.ctx, `INSERT INTO user_tables (instance_id, name) VALUES (?, ?)
			ON CONFLICT (instance_id, name) DO NOTHING`, s.id, m[1]); err != nil {
			return nil, err
		}
	}
	return s.tx.Exec(s.ctx, query, args...)
}

// Query runs a query.
func (s *SQL) Query(query string, args ...any) (*sql.Rows, error) {
	return s.tx.Query(s.ctx, query, args...)
}

// QueryRow runs a query that returns at most one row.
func (s *SQL) QueryRow(query string, args ...any) *sql.Row {
	return s.tx.QueryRow(s.ctx, query, args...)
}

// Update runs fn in a read-write transaction over the instance's tables and
// commits it when fn returns nil.
func (b Storage) Update(ctx context.Context, fn func(*SQL) error) error {
	return b.in.db().Update(ctx, func(tx store.Tx) error {
		return fn(newSQL(ctx, tx, b.in))
	})
}

// View runs fn in a read-only transaction over the instance's tables.
func (b Storage) View(ctx context.Context, fn func(*SQL) error) error {
	return b.in.rt.db.View(ctx, func(tx store.Tx) error {
		return fn(newSQL(ctx, tx, b.in))
	})
}
