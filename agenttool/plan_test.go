package agenttool

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/sqlite"
)

// TestRegistryQueriesUseTheirIndexes checks SQLite's plans for the
// queries whose cost would otherwise grow with every run a parent retains,
// or with every chunk of a child: the concurrency cap's count reads only
// the runs in flight, the listing in start order reads an index in that
// order instead of sorting, and a run's stored stream (the replay's and a
// terminal write's) reads each stream's chunks by their key rather than
// every chunk of the child with a search for its stream each.
func TestRegistryQueriesUseTheirIndexes(t *testing.T) {
	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "plan.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rt, err := agent.New(ctx, agent.Options{DB: db})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if err := chat.Migrate(ctx, rt); err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx, db, "agenttool", migrations); err != nil {
		t.Fatal(err)
	}
	const chunksByKey = "SEARCH ch USING INDEX sqlite_autoindex_chat_chunks_1 (instance_id=? AND stream_id=?"
	for _, c := range []struct {
		query     string
		args      []any
		want, not string
	}{
		{countInFlight, []any{int64(1)}, "USING INDEX agent_tool_runs_active", ""},
		{`SELECT ` + runCols + ` FROM agent_tool_runs WHERE instance_id = ? ORDER BY started_at, run_id`, []any{int64(1)},
			"USING INDEX agent_tool_runs_order", "TEMP B-TREE"},
		{chunkGroupsQuery, []any{int64(1)}, chunksByKey, ""},
		{storedStreamQuery, []any{"p", "r", 0}, chunksByKey, ""},
	} {
		var plan []string
		err := db.View(ctx, func(tx store.Tx) error {
			rows, err := tx.Query(ctx, `EXPLAIN QUERY PLAN `+c.query, c.args...)
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
