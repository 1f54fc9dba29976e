package agenttool_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
	"github.com/agentry/agentry/store"
)

// delKit drives the finish hook of DelParent.
type delKit struct {
	child model.Model

	mu    sync.Mutex
	calls map[string][]string // run id → the DeliveryKey of each call
	// failWrite makes the hook's write of these runs fail at its commit
	// (once each).
	failWrite map[string]bool
	// hold, when set, is where the hook of a run waits before it writes.
	hold func(runID string)
	errs map[string]error // run id → the error of the hook's last write
}

func newDelKit() *delKit {
	return &delKit{
		child: scripted.New(scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text("done")}))),
		calls: map[string][]string{}, failWrite: map[string]bool{}, errs: map[string]error{},
	}
}

// DelParent records each finish in its own table through the hook's
// context, except for runs named mem-…, whose hook only counts in memory.
type DelParent struct {
	agent.Base
	k *delKit
}

func (p *DelParent) OnStart(ctx context.Context) error {
	return p.Storage().Update(ctx, func(s *agent.SQL) error {
		_, err := s.Exec(`CREATE TABLE IF NOT EXISTS {finish_log} (run_id TEXT PRIMARY KEY, status TEXT NOT NULL)`)
		return err
	})
}

func (p *DelParent) OnAgentToolFinish(ctx context.Context, run agenttool.Run, res agenttool.Result) {
	p.k.mu.Lock()
	p.k.calls[run.RunID] = append(p.k.calls[run.RunID], agenttool.DeliveryKey(ctx))
	fail := p.k.failWrite[run.RunID]
	delete(p.k.failWrite, run.RunID)
	hold := p.k.hold
	p.k.mu.Unlock()
	if strings.HasPrefix(run.RunID, "mem-") {
		return
	}
	if hold != nil {
		hold(run.RunID)
	}
	if fail {
		// The transaction fails at its commit, after its writes (and the
		// delivery mark).
		ctx = store.WithFence(ctx, func(context.Context, store.Tx) error { return errors.New("the commit failed") })
	}
	err := p.Storage().Update(ctx, func(s *agent.SQL) error {
		_, err := s.Exec(`INSERT INTO {finish_log} (run_id, status) VALUES (?, ?)`, run.RunID, string(res.Status))
		return err
	})
	p.k.mu.Lock()
	p.k.errs[run.RunID] = err
	p.k.mu.Unlock()
}

// DelChild answers at once.
type DelChild struct {
	chat.Base
	k *delKit
}

func (c *DelChild) ChatModel() model.Model { return c.k.child }

type delEnv struct {
	*testenv.Env
	ev *events
}

func delStart(t *testing.T, k *delKit, dir string) *delEnv {
	t.Helper()
	ev := &events{changed: make(chan struct{})}
	env := startEnv(t, testenv.Options{Postgres: &pg, Dir: dir, Classes: []agent.Class{
		{Name: "DelParent", New: func() agent.Agent { return &DelParent{k: k} }},
		{Name: "DelChild", New: func() agent.Agent { return &DelChild{k: k} }},
	}}, chat.Config{}, agenttool.Options{}, func(rt *agent.Runtime) {
		rt.Diag().Subscribe(diag.ChannelAgentTool, ev.add)
	})
	return &delEnv{Env: env, ev: ev}
}

func (e *delEnv) parent(t *testing.T) agent.Agent {
	t.Helper()
	p, err := e.RT.Get(testCtx(t), agent.Root("DelParent", "p"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (e *delEnv) run(t *testing.T, runID string) {
	t.Helper()
	res, err := agenttool.RunAgentTool(testCtx(t), e.parent(t), "DelChild", agenttool.RunOptions{RunID: runID, Input: "go"})
	if err != nil || res.Status != agenttool.StatusCompleted {
		t.Fatalf("run %s: %+v %v", runID, res, err)
	}
}

// delivered reads whether the run's end is recorded delivered.
func (e *delEnv) delivered(t *testing.T, runID string) bool {
	t.Helper()
	var at sql.NullInt64
	ctx := testCtx(t)
	err := e.DB.View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT finish_delivered_at FROM agent_tool_runs WHERE run_id = ?`, runID).Scan(&at)
	})
	if err != nil {
		t.Fatal(err)
	}
	return at.Valid
}

// ledger reads DelParent's finish log.
func (e *delEnv) ledger(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := agent.BaseOf(e.parent(t)).Storage().View(testCtx(t), func(s *agent.SQL) error {
		rows, err := s.Query(`SELECT run_id, status FROM {finish_log}`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id, st string
			if err := rows.Scan(&id, &st); err != nil {
				return err
			}
			out[id] = st
		}
		return rows.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (k *delKit) callsOf(runID string) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.calls[runID]...)
}

// TestFinishDeliveredOnceAcrossRestarts: an awaited run's end is delivered
// to OnAgentToolFinish durably. A hook whose write committed (with the
// delivery mark, in its own transaction) and a hook that wrote nothing
// (its mark written after it) are not called again after a restart; a
// hook whose write failed to commit, and an end recorded but never delivered (a
// crash between the terminal write and the hook), are delivered at the
// parent's next start, once, with the same DeliveryKey.
func TestFinishDeliveredOnceAcrossRestarts(t *testing.T) {
	k := newDelKit()
	e1 := delStart(t, k, "")
	e1.run(t, "written")
	e1.run(t, "mem-1")
	k.mu.Lock()
	k.failWrite["failed"] = true
	k.mu.Unlock()
	e1.run(t, "failed")
	e1.run(t, "crashed")
	e1.run(t, "mem-2") // its dispatch carried mem-1's mark
	if !e1.delivered(t, "written") || !e1.delivered(t, "mem-1") {
		t.Fatal("the ends of written and mem-1 are not recorded delivered")
	}
	if e1.delivered(t, "failed") {
		t.Fatal("the end of failed is recorded delivered, but its hook's write failed")
	}
	// The process died between crashed's terminal write and its hook.
	ctx := testCtx(t)
	err := e1.DB.Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE agent_tool_runs SET finish_delivered_at = NULL WHERE run_id = 'crashed'`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := agent.BaseOf(e1.parent(t)).Storage().Update(ctx, func(s *agent.SQL) error {
		_, err := s.Exec(`DELETE FROM {finish_log} WHERE run_id = 'crashed'`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	e1.Close() // writes mem-2's mark, still pending

	e2 := delStart(t, k, e1.Dir)
	e2.parent(t)
	for _, id := range []string{"failed", "crashed"} {
		e2.ev.waitCount(t, testCtx(t), func() string { return "the delivery of " + id }, 1, func(ev diag.Event) bool {
			return ev.Type == "recovery:redelivered" && ev.Attrs["runId"] == id
		})
	}
	if !e2.delivered(t, "failed") || !e2.delivered(t, "crashed") {
		t.Fatal("the redelivered ends are not recorded delivered")
	}
	want := map[string]string{"written": "completed", "failed": "completed", "crashed": "completed"}
	got := e2.ledger(t)
	for id, st := range want {
		if got[id] != st {
			t.Errorf("ledger %v, want %v", got, want)
			break
		}
	}
	if len(got) != len(want) {
		t.Errorf("ledger %v, want %v", got, want)
	}
	for id, n := range map[string]int{"written": 1, "mem-1": 1, "mem-2": 1, "failed": 2, "crashed": 2} {
		keys := k.callsOf(id)
		if len(keys) != n {
			t.Errorf("hook of %s called %d times, want %d", id, len(keys), n)
			continue
		}
		if keys[0] == "" || keys[len(keys)-1] != keys[0] {
			t.Errorf("hook of %s had delivery keys %q, want one non-empty key", id, keys)
		}
	}
	e2.Close()

	// Everything is delivered now: a third start delivers nothing.
	e3 := delStart(t, k, e1.Dir)
	e3.run(t, "after") // the parent started, and a run ended since
	if n := e3.ev.countWhere(func(ev diag.Event) bool { return ev.Type == "recovery:redelivered" }); n != 0 {
		t.Errorf("%d redeliveries after everything was delivered", n)
	}
	if got := e3.ledger(t); len(got) != 4 {
		t.Errorf("ledger %v, want 4 runs", got)
	}
	e3.Close()
}

// TestFinishDeliveryRefusedWhenDeliveredMeanwhile: a hook whose end was
// recorded delivered while it ran (by a delivery that won a race with
// it) has its write refused, so its effect does not happen twice.
func TestFinishDeliveryRefusedWhenDeliveredMeanwhile(t *testing.T) {
	k := newDelKit()
	e := delStart(t, k, "")
	ctx := testCtx(t)
	k.hold = func(runID string) {
		err := e.DB.Update(ctx, func(tx store.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE agent_tool_runs SET finish_delivered_at = 1 WHERE run_id = ?`, runID)
			return err
		})
		if err != nil {
			t.Error(err)
		}
	}
	e.run(t, "raced")
	k.mu.Lock()
	err := k.errs["raced"]
	k.mu.Unlock()
	if err == nil || !strings.Contains(err.Error(), "delivered already") {
		t.Fatalf("the hook's write returned %v, want a refusal", err)
	}
	if got := e.ledger(t); len(got) != 0 {
		t.Fatalf("ledger %v, want nothing: the other delivery made the effect", got)
	}
	e.Close()
}

// TestUndeliveredEndWakesItsParent: an end recorded but not delivered is a
// wake reason of its parent of its own, so a restart delivers it at once,
// though nothing else of the parent is unfinished and no client uses it;
// the delivery clears the reason (a later start wakes nothing), and the
// hook's write happens once.
func TestUndeliveredEndWakesItsParent(t *testing.T) {
	k := newDelKit()
	e1 := delStart(t, k, "")
	k.mu.Lock()
	k.failWrite["failed"] = true
	k.mu.Unlock()
	e1.run(t, "failed") // the hook's write failed at its commit: undelivered
	e1.run(t, "written")
	if e1.delivered(t, "failed") || !e1.delivered(t, "written") {
		t.Fatal("want failed undelivered and written delivered")
	}
	if n := e1.finishWakes(t); n != 1 {
		t.Fatalf("%d finish wake reasons, want 1 (failed's)", n)
	}
	e1.Close()

	// The parent is not used: its start comes from its wake reason.
	e2 := delStart(t, k, e1.Dir)
	e2.ev.waitCount(t, testCtx(t), func() string { return "the delivery of failed" }, 1, func(ev diag.Event) bool {
		return ev.Type == "recovery:redelivered" && ev.Attrs["runId"] == "failed"
	})
	if !e2.delivered(t, "failed") {
		t.Fatal("the redelivered end is not recorded delivered")
	}
	if n := e2.finishWakes(t); n != 0 {
		t.Fatalf("%d finish wake reasons after the delivery, want 0", n)
	}
	if got := e2.ledger(t); got["failed"] != "completed" || got["written"] != "completed" || len(got) != 2 {
		t.Fatalf("ledger %v", got)
	}
	if n := len(k.callsOf("failed")); n != 2 {
		t.Fatalf("hook of failed called %d times, want 2 (the failed write, the delivery)", n)
	}
	e2.Close()

	e3 := delStart(t, k, e1.Dir)
	woken := 0
	err := e3.DB.View(testCtx(t), func(tx store.Tx) error {
		return tx.QueryRow(testCtx(t), `SELECT COUNT(*) FROM instance_wake`).Scan(&woken)
	})
	if err != nil || woken != 0 {
		t.Fatalf("%d wake reasons after everything was delivered (%v)", woken, err)
	}
	e3.Close()
	if n := len(k.callsOf("failed")); n != 2 {
		t.Fatalf("hook of failed called %d times, want 2", n)
	}
}

// finishWakes counts the finish wake reasons in the database.
func (e *delEnv) finishWakes(t *testing.T) int {
	t.Helper()
	var n int
	ctx := testCtx(t)
	err := e.DB.View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM instance_wake WHERE reason LIKE 'agent-tool-finish:%'`).Scan(&n)
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRedispatchDeliversAnUndeliveredEnd: an end whose delivery was cut
// while this copy of the parent lives (its hook's transaction failed at
// its commit, as the hook of a copy that lost its shard fails under the
// fence while the new copy has started already) is delivered by the next
// dispatch of the run id, once: a further dispatch delivers nothing. Before,
// it waited for the parent's next start.
func TestRedispatchDeliversAnUndeliveredEnd(t *testing.T) {
	k := newDelKit()
	e := delStart(t, k, "")
	k.mu.Lock()
	k.failWrite["cut"] = true
	k.mu.Unlock()
	e.run(t, "cut")
	if e.delivered(t, "cut") {
		t.Fatal("the end of cut is recorded delivered although its hook's write failed")
	}
	e.run(t, "cut") // the stored end, and its delivery now
	if !e.delivered(t, "cut") {
		t.Fatal("a dispatch of a run whose end is not delivered did not deliver it")
	}
	e.run(t, "cut")
	if n := len(k.callsOf("cut")); n != 2 {
		t.Fatalf("hook of cut called %d times, want 2 (the failed write, the delivery)", n)
	}
	if got := e.ledger(t); got["cut"] != "completed" || len(got) != 1 {
		t.Fatalf("ledger %v", got)
	}
}
