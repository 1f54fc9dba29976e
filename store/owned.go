package store

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
)

// Owner identifies the instance whose own tables a statement names: its
// row id in instances and its class.
type Owner struct {
	ID    int64
	Class string
}

// OwnedTables is implemented by a Tx whose engine stores instances' own
// tables its own way (store/postgres keeps one shared table per class and
// name). A Tx that does not implement it gets the default: one physical
// table per instance, named u<id>_<name>.
type OwnedTables interface {
	// Owned returns a Tx over the same transaction in which a table name
	// in braces ({notes}) names one of o's own tables.
	Owned(o Owner) Tx
	// DropOwned removes o's table name (its rows, where tables are
	// shared).
	DropOwned(ctx context.Context, o Owner, name string) error
}

// OwnedTx returns a Tx over tx in which a table name in braces names one
// of o's own tables: a table private to o, however the engine keeps it.
func OwnedTx(tx Tx, o Owner) Tx {
	if ot, ok := tx.(OwnedTables); ok {
		return ot.Owned(o)
	}
	return prefixed{tx: tx, id: o.ID}
}

// DropOwned removes o's own table name in tx.
func DropOwned(ctx context.Context, tx Tx, o Owner, name string) error {
	if ot, ok := tx.(OwnedTables); ok {
		return ot.DropOwned(ctx, o, name)
	}
	_, err := tx.Exec(ctx, `DROP TABLE IF EXISTS `+prefixedName(o.ID, name))
	return err
}

// OwnedTableRef matches a table name in braces.
var OwnedTableRef = regexp.MustCompile(`\{([A-Za-z_][A-Za-z0-9_]*)\}`)

func prefixedName(id int64, name string) string { return fmt.Sprintf("u%d_%s", id, name) }

// prefixed is the default owned-table Tx: {name} becomes u<id>_<name>.
type prefixed struct {
	tx Tx
	id int64
}

func (p prefixed) rewrite(q string) string {
	return OwnedTableRef.ReplaceAllStringFunc(q, func(m string) string {
		return prefixedName(p.id, m[1:len(m)-1])
	})
}

func (p prefixed) Exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return p.tx.Exec(ctx, p.rewrite(q), args...)
}

func (p prefixed) Query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return p.tx.Query(ctx, p.rewrite(q), args...)
}

func (p prefixed) QueryRow(ctx context.Context, q string, args ...any) *sql.Row {
	return p.tx.QueryRow(ctx, p.rewrite(q), args...)
}
