package agenttool

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/sqlite"
)

// TestRegistryQueriesUseTheirIndexes checks SQLite's plans for the
// registry's two queries whose cost would otherwise grow with every run a
// parent retains: the concurrency cap's count reads only the runs in
// flight, and the listing in start order reads an index in that order
// instead of sorting.
func TestRegistryQueriesUseTheirIndexes(t *testing.T) {
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "plan.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := store.Migrate(ctx, db, "agenttool", migrations); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ query, want, not string }{
		{countInFlight, "USING INDEX agent_tool_runs_active", ""},
		{`SELECT ` + runCols + ` FROM agent_tool_runs WHERE instance_id = ? ORDER BY started_at, run_id`,
			"USING INDEX agent_tool_runs_order", "TEMP B-TREE"},
	} {
		var plan []string
		err := db.View(ctx, func(tx store.Tx) error {
			rows, err := tx.Query(ctx, `EXPLAIN QUERY PLAN `+c.query, int64(1))
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var id, parent, notUsed int
				var detail string
				if err := rows.Scan(&id, &parent, &notUsed, &detail); err != nil {
					return err
				}
				plan = append(plan, detail)
			}
			return rows.Err()
		})
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Join(plan, "; ")
		if !strings.Contains(got, c.want) || (c.not != "" && strings.Contains(got, c.not)) {
			t.Errorf("plan of %q:\n%s\nwant %q%s", c.query, got, c.want, map[bool]string{true: ", without " + c.not}[c.not != ""])
		}
	}
}
