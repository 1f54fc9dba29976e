package agenttool_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/store/sqlite"
)

// observedDB serializes write transactions and, after each commit, reads
// the states of one run: the parent's registry row and the child's record.
// It counts the write and read transactions of the code under test (its
// own reads are not counted).
type observedDB struct {
	store.DB
	mu            sync.Mutex
	writes, reads int
	runID         string
	states        [][2]string // parent status, child status after each commit
	stacks        []string
}

func (d *observedDB) Update(ctx context.Context, fn func(store.Tx) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.writes++
	err := d.DB.Update(ctx, fn)
	if d.runID == "" || err != nil {
		return err
	}
	var parent, child sql.NullString
	verr := d.DB.View(ctx, func(tx store.Tx) error {
		err := tx.QueryRow(ctx, `SELECT status FROM agent_tool_runs WHERE run_id = ?`, d.runID).Scan(&parent)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		err = tx.QueryRow(ctx, `SELECT status FROM agent_tool_child_runs WHERE run_id = ?`, d.runID).Scan(&child)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		return err
	})
	if verr != nil {
		return verr
	}
	d.states = append(d.states, [2]string{parent.String, child.String})
	return nil
}

func (d *observedDB) View(ctx context.Context, fn func(store.Tx) error) error {
	stack := string(debug.Stack())
	if strings.Contains(stack, "agent.(*scheduler)") {
		// The runtime's scheduler looks for due schedules now and then:
		// not a read of the run.
		return d.DB.View(ctx, fn)
	}
	d.mu.Lock()
	d.reads++
	if d.runID != "" {
		d.stacks = append(d.stacks, stack)
	}
	d.mu.Unlock()
	return d.DB.View(ctx, fn)
}

func (d *observedDB) observe(runID string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.writes, d.reads, d.runID, d.states, d.stacks = 0, 0, runID, nil, nil
}

func (d *observedDB) result() (writes, reads int, states [][2]string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.writes, d.reads, append([][2]string(nil), d.states...)
}

// TestAwaitedRunFusedTransactions: an awaited run of a trivial child that
// it creates costs at most 4 write and 2 read transactions (the dispatch,
// the child's creation, its turn's first commit and its end), its records
// appear together (the parent's row, running, with the child's record) and
// end together: no commit ever leaves the child's record ended with the
// parent's row still running, or the other way round.
func TestAwaitedRunFusedTransactions(t *testing.T) {
	ctx := testCtx(t)
	sq, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "agentry.db"))
	if err != nil {
		t.Fatal(err)
	}
	db := &observedDB{DB: sq}
	rt, err := agent.New(ctx, agent.Options{DB: db, IdleTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer sq.Close()
	defer rt.Close()
	// Batches wait for the end, however slowly the child streams (a
	// loaded machine, -race): only the first chunk commits at once.
	chat.Configure(rt, chat.Config{FlushInterval: time.Hour})
	agenttool.Install(rt, agenttool.Options{})
	k := newKit()
	for _, c := range []agent.Class{
		{Name: "Assistant", New: func() agent.Agent { return &assistant{k: k} }},
		{Name: "Researcher", New: func() agent.Agent { return &researcher{k: k} }},
	} {
		if err := rt.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := rt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	a, err := rt.Get(ctx, agent.Root("Assistant", "fuse"))
	if err != nil {
		t.Fatal(err)
	}
	// The first run migrates the layers' schemas.
	if res, err := agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{Input: researchInput{Query: "warm"}}); err != nil || res.Status != agenttool.StatusCompleted {
		t.Fatalf("warm-up: %+v, %v", res, err)
	}
	for i := range 5 {
		runID := "fused-" + string(rune('a'+i))
		db.observe(runID)
		res, err := agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{Input: researchInput{Query: "q"}, RunID: runID})
		if err != nil || res.Status != agenttool.StatusCompleted || res.Summary != "Findings for q" {
			t.Fatalf("run %s: %+v, %v", runID, res, err)
		}
		writes, reads, states := db.result()
		// An explicit run id costs one read (is it taken?), and a child
		// whose turn ended before the parent followed it one more (its
		// stored chunks).
		if writes > 4 || reads > 2 {
			t.Errorf("run %s: %d write and %d read transactions, want at most 4 and 2\n%s", runID, writes, reads, db.stacks)
		}
		for _, s := range states {
			parentEnded, childEnded := s[0] == "completed", s[1] == "completed"
			if parentEnded != childEnded || (s[0] == "") != (s[1] == "") {
				t.Fatalf("run %s: a commit left the parent's row %q and the child's record %q: %v", runID, s[0], s[1], states)
			}
		}
		if n := len(states); n == 0 || states[n-1] != [2]string{"completed", "completed"} {
			t.Fatalf("run %s: states %v, want both completed at the end", runID, states)
		}
	}
}
