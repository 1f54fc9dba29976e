package pgtest_test

import (
	"context"
	"os"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/agentry/agentry/internal/testkit/pgtest"
)

var pg pgtest.Cluster

func TestMain(m *testing.M) { goleak.VerifyTestMain(pg.Wrap(m)) }

// TestURL: each call gives a database of its own, empty, reachable over
// loopback, served by a server that does not run as root.
func TestURL(t *testing.T) {
	ctx := context.Background()
	a, b := pg.URL(t), pg.URL(t)
	if a == b {
		t.Fatalf("two tests share %s", a)
	}
	ca, err := pgx.Connect(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close(ctx)
	cb, err := pgx.Connect(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close(ctx)
	if _, err := ca.Exec(ctx, `CREATE TABLE only_in_a (x int)`); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := cb.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatal("a table created in one test's database is visible in another's")
	}
	var dataDir string
	if err := ca.QueryRow(ctx, `SELECT current_setting('data_directory')`).Scan(&dataDir); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	if uid := st.Sys().(*syscall.Stat_t).Uid; uid == 0 {
		t.Fatalf("the cluster's data folder %s belongs to root", dataDir)
	}
}

// TestFsyncOff: the scratch cluster trades durability for speed.
func TestFsyncOff(t *testing.T) {
	ctx := context.Background()
	c, err := pgx.Connect(ctx, pg.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var fsync string
	if err := c.QueryRow(ctx, `SHOW fsync`).Scan(&fsync); err != nil {
		t.Fatal(err)
	}
	if fsync != "off" {
		t.Fatalf("fsync = %s", fsync)
	}
}
