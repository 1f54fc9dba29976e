package postgres_test

import (
	"context"
	"testing"

	"go.uber.org/goleak"

	"github.com/agentry/agentry/internal/pgtest"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/postgres"
	"github.com/agentry/agentry/store/storetest"
)

var pg pgtest.Cluster

func TestMain(m *testing.M) { goleak.VerifyTestMain(pg.Wrap(m)) }

func open(t *testing.T, opts postgres.Options) *postgres.DB {
	t.Helper()
	db, err := postgres.OpenOptions(context.Background(), pg.URL(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.DB { return open(t, postgres.Options{}) })
}
