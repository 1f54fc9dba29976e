package cluster

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"

	"github.com/agentry/agentry/internal/testkit/pgtest"
	"github.com/agentry/agentry/store"
)

var pg pgtest.Cluster

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(pg.Wrap(m), goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
}

// db is a test database: a pgx pool for the cluster's tables and a
// database/sql handle for store.Tx transactions (the fencing check).
type db struct {
	url  string
	pool *pgxpool.Pool
	sql  *sql.DB
}

func newDB(t testing.TB) *db {
	t.Helper()
	url := pg.URL(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	sdb, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sdb.Close(); pool.Close() })
	return &db{url: url, pool: pool, sql: sdb}
}

// sqlTx is a store.Tx over database/sql with "?" placeholders rewritten.
type sqlTx struct{ tx *sql.Tx }

func rebind(q string) string {
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (t sqlTx) Exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return t.tx.ExecContext(ctx, rebind(q), args...)
}
func (t sqlTx) Query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return t.tx.QueryContext(ctx, rebind(q), args...)
}
func (t sqlTx) QueryRow(ctx context.Context, q string, args ...any) *sql.Row {
	return t.tx.QueryRowContext(ctx, rebind(q), args...)
}

var _ store.Tx = sqlTx{}

// begin opens a transaction for a fencing test; the caller ends it.
func (d *db) begin(t testing.TB) (*sql.Tx, store.Tx) {
	t.Helper()
	tx, err := d.sql.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return tx, sqlTx{tx}
}
