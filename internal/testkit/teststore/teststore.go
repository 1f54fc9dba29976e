// Package teststore opens the store.DB a test runs on: SQLite in the
// test's data folder by default, or a PostgreSQL database of a scratch
// cluster (internal/testkit/pgtest) when AGENTRY_TEST_STORE=postgres, so the
// storage-using tests of agent, chat and agenttool run on either engine:
//
//	AGENTRY_TEST_STORE=postgres go test ./chat ./agenttool
package teststore

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/internal/testkit/pgtest"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/postgres"
	"github.com/agentry/agentry/store/sqlite"
)

// Postgres reports whether tests run on PostgreSQL
// (AGENTRY_TEST_STORE=postgres).
func Postgres() bool { return os.Getenv("AGENTRY_TEST_STORE") == "postgres" }

// RunOnPostgres runs each of tests as a subtest of t with
// AGENTRY_TEST_STORE=postgres, so that a package's chosen scenarios run on
// PostgreSQL in every test run and not only when the whole package is run
// there. A subtest is named after its function, without the package and
// the "Test" prefix (TestToolSuccess runs as ToolSuccess).
func RunOnPostgres(t *testing.T, tests ...func(*testing.T)) {
	t.Setenv("AGENTRY_TEST_STORE", "postgres")
	for _, test := range tests {
		name := runtime.FuncForPC(reflect.ValueOf(test).Pointer()).Name()
		t.Run(strings.TrimPrefix(name[strings.LastIndex(name, ".")+1:], "Test"), test)
	}
}

// Open opens the database of data folder dir: dir/agentry.db on SQLite,
// or on PostgreSQL (when Postgres() and pg is not nil) the database of
// pg named by dir, so that reopening the same folder reopens the same
// data. The caller closes it.
func Open(t testing.TB, pg *pgtest.Cluster, dir string) store.DB {
	t.Helper()
	ctx := context.Background()
	if pg != nil && Postgres() {
		db, err := postgres.Open(ctx, pg.Named(t, dir))
		if err != nil {
			t.Fatal(err)
		}
		return db
	}
	db, err := sqlite.Open(ctx, filepath.Join(dir, "agentry.db"))
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// NewRuntime returns a runtime with opts on a SQLite file of its own (in a
// folder of the test's), not started; the runtime and its database are
// closed at cleanup. opts.DB is replaced.
func NewRuntime(t testing.TB, opts agent.Options) *agent.Runtime {
	t.Helper()
	db := Open(t, nil, t.TempDir())
	opts.DB = db
	rt, err := agent.New(context.Background(), opts)
	if err != nil {
		db.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rt.Close()
		db.Close()
	})
	return rt
}
