package agenttool_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/model/scripted"
	"github.com/agentry/agentry/store"
)

// epochPlacement owns every instance; the root instances under one lease
// epoch, which the test moves (the node lost their shard and took it
// back), the others under epoch 1 (their shards stay). A write of a
// hydration made under another epoch is refused, as package cluster's
// fence refuses it (a shard lease lost, fenced).
type epochPlacement struct {
	roots    atomic.Int64
	children atomic.Int64 // the other instances' epoch; 0 means 1
}

func (p *epochPlacement) Owns(agent.Path) bool { return true }

func (p *epochPlacement) Epoch(path agent.Path) (int64, bool) {
	if len(path) == 1 {
		return p.roots.Load(), true
	}
	if e := p.children.Load(); e != 0 {
		return e, true
	}
	return 1, true
}

func (p *epochPlacement) Fence(ctx context.Context, tx store.Tx, path agent.Path, epoch int64) error {
	if cur, _ := p.Epoch(path); epoch != 0 && epoch != cur {
		return fmt.Errorf("test fence: %s was hydrated under epoch %d, the lease is at epoch %d", path, epoch, cur)
	}
	return nil
}

// countingParent records, through its hook's context, how many times
// each run's end was delivered to OnAgentToolFinish (a write refused by
// the fence records nothing).
type countingParent struct{ chat.Base }

func (p *countingParent) OnStart(ctx context.Context) error {
	return p.Storage().Update(ctx, func(s *agent.SQL) error {
		_, err := s.Exec(`CREATE TABLE IF NOT EXISTS {finish_count} (run_id TEXT PRIMARY KEY, n INTEGER NOT NULL, status TEXT NOT NULL)`)
		return err
	})
}

func (p *countingParent) OnAgentToolFinish(ctx context.Context, run agenttool.Run, res agenttool.Result) {
	err := p.Storage().Update(ctx, func(s *agent.SQL) error {
		_, err := s.Exec(`INSERT INTO {finish_count} (run_id, n, status) VALUES (?, 1, ?)
			ON CONFLICT (run_id) DO UPDATE SET n = {finish_count}.n + 1`, run.RunID, string(res.Status))
		return err
	})
	if err != nil {
		p.Logger().Warn("test: record finish", "run", run.RunID, "err", err)
	}
}

// deliveries returns, per run, how many deliveries the hook recorded and
// the last status.
func (p *countingParent) deliveries(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := p.Storage().View(testCtx(t), func(s *agent.SQL) error {
		rows, err := s.Query(`SELECT run_id, n, status FROM {finish_count}`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id, st string
			var n int
			if err := rows.Scan(&id, &n, &st); err != nil {
				return err
			}
			out[id] = fmt.Sprintf("%s×%d", st, n)
		}
		return rows.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// staleEnv is one node on PostgreSQL whose root instances lose their
// shard and take it back on demand (retake); the child Leaf's model waits
// for leaf.release on its first call.
type staleEnv struct {
	e     *testenv.Env
	place *epochPlacement
	leaf  *gatedModel
	k     *kit
	ev    *events
	path  agent.Path // the parent, Root/stale
}

func startStale(t *testing.T) *staleEnv {
	t.Helper()
	t.Setenv("AGENTRY_TEST_STORE", "postgres")
	s := &staleEnv{place: &epochPlacement{}, k: newKit(), ev: &events{changed: make(chan struct{})}, path: agent.Root("Root", "stale")}
	s.place.roots.Store(1)
	s.leaf = &gatedModel{Model: scripted.New(scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text("leaf answer")}))),
		entered: make(chan struct{}), release: make(chan struct{})}
	classes := []agent.Class{
		{Name: "Root", Public: true, New: func() agent.Agent { return &countingParent{} }},
		{Name: "Leaf", New: func() agent.Agent { return &treeAgent{m: s.leaf} }},
	}
	s.e = startEnv(t, testenv.Options{Postgres: &pg, Dir: t.TempDir(), Classes: classes, Placement: s.place, Logger: s.k.logs.Logger()},
		chat.Config{}, agenttool.Options{}, func(rt *agent.Runtime) { rt.Diag().Subscribe(diag.ChannelAgentTool, s.ev.add) })
	return s
}

// retake moves the roots' lease to epoch 2: the node lost the parent's
// shard and took it back. The copy hydrated under epoch 1 is dropped (its
// goroutines go on, its writes are refused), and the parent is hydrated
// again under epoch 2: retake returns that copy.
func (s *staleEnv) retake(t *testing.T) agent.Agent {
	t.Helper()
	old, ok := s.e.RT.Lookup(s.path)
	s.place.roots.Store(2)
	s.e.RT.Drop(func(p agent.Path) bool { return p.String() == s.path.String() })
	cur, err := s.e.RT.Get(testCtx(t), s.path)
	if err != nil {
		t.Fatal(err)
	}
	if ok && cur == old {
		t.Fatal("the dropped copy was served again")
	}
	return cur
}

// checkDelivered fails the test unless run runID's end is recorded
// delivered with no finish wake reason left.
func (s *staleEnv) checkDelivered(t *testing.T, runID string) {
	t.Helper()
	ctx := testCtx(t)
	var delivered bool
	var wakes int
	err := s.e.RT.DB().View(ctx, func(tx store.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT finish_delivered_at IS NOT NULL FROM agent_tool_runs WHERE run_id = ?`, runID).Scan(&delivered); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM instance_wake WHERE reason = ?`, "agent-tool-finish:"+runID).Scan(&wakes)
	})
	if err != nil {
		t.Fatal(err)
	}
	if !delivered || wakes != 0 {
		t.Fatalf("end of %s delivered=%v with %d finish wake reasons, want delivered and none", runID, delivered, wakes)
	}
}

type runOutcome struct {
	res agenttool.Result
	err error
}

// TestStaleCopyLeavesTheEndToTheCurrentCopy (issue 24, the failure of
// TestPostgresRestartDuringFanOut under -race): the parent's node lost its
// shard and took it back at a new epoch, so the parent was dropped and
// hydrated again while the old copy's dispatches still ran. The current
// copy dispatches a run (fused: the child's end records the parent's end
// under the current copy's fence); the old copy, dispatching the same run
// id late, finds it in flight and follows the same child run. The child
// ends while the current copy waits for its gate. The end belongs to the
// copy whose fuse recorded it, and is delivered by it: once, through the
// current copy's hook. Before, the old copy took the fused end first, its
// hook's write was refused by the fence, and the current copy found the
// end recorded by someone else and delivered nothing: the end stayed
// undelivered until a client dispatched the run again (the fan-out's
// finish ledger held 149 of 150).
func TestStaleCopyLeavesTheEndToTheCurrentCopy(t *testing.T) {
	s := startStale(t)
	ctx := testCtx(t)
	old, err := s.e.RT.Get(ctx, s.path)
	if err != nil {
		t.Fatal(err)
	}
	cur := s.retake(t)
	ev, leaf := s.ev, s.leaf

	// The current copy dispatches the run as one of its inputs: its wait
	// for the child gives the gate back, and it takes the gate again
	// before it records the end.
	input := agenttool.RunOptions{RunID: "r1", Input: treeInput{Query: "q"}}
	curDone := make(chan runOutcome, 1)
	go func() {
		var o runOutcome
		o.err = agent.Enter(ctx, cur, func(ctx context.Context) error {
			var err error
			o.res, err = agenttool.RunAgentTool(ctx, cur, "Leaf", input)
			return err
		})
		curDone <- o
	}()
	<-leaf.entered // dispatched: the child's turn runs
	// Hold the current copy's gate: it gets it once the dispatch waits for
	// the child, and keeps the current copy from the end until released.
	held, unblock := make(chan struct{}), make(chan struct{})
	holderDone := make(chan error, 1)
	go func() {
		holderDone <- agent.Enter(ctx, cur, func(context.Context) error {
			close(held)
			select {
			case <-unblock:
			case <-ctx.Done():
			}
			return nil
		})
	}()
	select {
	case <-held:
	case o := <-curDone:
		t.Fatalf("the current copy's dispatch returned before the child ended: %+v %v", o.res, o.err)
	case <-ctx.Done():
		t.Fatal("the current copy never waited for the child")
	}

	// The old copy's late dispatch of the same run id follows the run in
	// flight, on the same child.
	oldDone := make(chan runOutcome, 1)
	go func() {
		res, err := agenttool.RunAgentTool(ctx, old, "Leaf", input)
		oldDone <- runOutcome{res, err}
	}()
	ev.waitWhere(t, ctx, func() string { return "the old copy's re-attach to r1" }, func(e diag.Event) bool {
		return e.Type == "recovery:reattach" && e.Attrs["runId"] == "r1"
	})
	close(leaf.release) // the child ends
	var stale runOutcome
	select {
	case stale = <-oldDone:
	case <-ctx.Done():
		t.Fatal("the old copy never returned")
	}
	t.Logf("old copy's dispatch: %+v %v", stale.res, stale.err)
	close(unblock)
	if err := <-holderDone; err != nil {
		t.Fatal(err)
	}
	var o runOutcome
	select {
	case o = <-curDone:
	case <-ctx.Done():
		t.Fatal("the current copy never returned")
	}
	if o.err != nil || o.res.Status != agenttool.StatusCompleted || o.res.Summary != "leaf answer" {
		t.Fatalf("current copy's dispatch: %+v %v, want completed with the child's answer", o.res, o.err)
	}
	if got := cur.(*countingParent).deliveries(t); got["r1"] != "completed×1" || len(got) != 1 {
		t.Fatalf("finish hook ledger %v, want r1 delivered once (completed×1)", got)
	}
	s.checkDelivered(t, "r1")
}

// TestReplacedCopysFuseDoesNotFailTheChildsEnd: the parent dispatched a
// run (fused: the child's end would record the parent's end under that
// copy's fence) and was then dropped with its lost shard, the child
// staying on its node. The child's end commits (its turn recorded done),
// never with the parent's end under the dropped copy's fence, and the
// parent's next copy delivers the end once: when it was hydrated before
// the child ended, its recovery re-attaches to the run (and arms its own
// fuse); when it is hydrated after, its recovery collects the run. Before,
// the child's end claimed the dropped copy's fuse and the fence refused
// the whole transaction: the child's turn was left unfinished in its
// storage, to be recovered again.
func TestReplacedCopysFuseDoesNotFailTheChildsEnd(t *testing.T) {
	for _, rehydrated := range []bool{true, false} {
		name := "child ends after the parent is hydrated again"
		if !rehydrated {
			name = "child ends before the parent is hydrated again"
		}
		t.Run(name, func(t *testing.T) { testReplacedCopysFuse(t, rehydrated) })
	}
}

func testReplacedCopysFuse(t *testing.T, rehydrated bool) {
	s := startStale(t)
	turns := &events{changed: make(chan struct{})}
	s.e.RT.Diag().Subscribe(diag.ChannelChat, turns.add)
	ctx := testCtx(t)
	old, err := s.e.RT.Get(ctx, s.path)
	if err != nil {
		t.Fatal(err)
	}
	oldDone := make(chan runOutcome, 1)
	go func() {
		res, err := agenttool.RunAgentTool(ctx, old, "Leaf", agenttool.RunOptions{RunID: "r2", Input: treeInput{Query: "q"}})
		oldDone <- runOutcome{res, err}
	}()
	<-s.leaf.entered // dispatched by the old copy: the child's turn runs
	child := s.path.Child("Leaf", "r2").String()
	var cur agent.Agent
	if rehydrated {
		cur = s.retake(t)
		s.ev.waitWhere(t, ctx, func() string { return "the new copy's re-attach to r2" }, func(e diag.Event) bool {
			return e.Type == "recovery:reattach" && e.Attrs["runId"] == "r2"
		})
		close(s.leaf.release) // the child ends
	} else {
		s.place.roots.Store(2)
		s.e.RT.Drop(func(p agent.Path) bool { return p.String() == s.path.String() })
		close(s.leaf.release) // the child ends
		turns.waitWhere(t, ctx, func() string { return "the end of the child's turn" }, func(e diag.Event) bool {
			return e.Type == "turn" && e.Agent == child
		})
		if cur, err = s.e.RT.Get(ctx, s.path); err != nil {
			t.Fatal(err)
		}
	}
	s.ev.waitWhere(t, ctx, func() string { return "the new copy's recovery of r2" }, func(e diag.Event) bool {
		return e.Type == "recovery:row" && e.Attrs["runId"] == "r2"
	})
	var stale runOutcome
	select {
	case stale = <-oldDone:
	case <-ctx.Done():
		t.Fatal("the old copy never returned")
	}
	t.Logf("old copy's dispatch: %+v %v", stale.res, stale.err)
	if got := cur.(*countingParent).deliveries(t); got["r2"] != "completed×1" || len(got) != 1 {
		t.Fatalf("finish hook ledger %v, want r2 delivered once (completed×1)", got)
	}
	s.checkDelivered(t, "r2")
	var open int
	err = s.e.RT.DB().View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM chat_streams c JOIN instances i ON i.id = c.instance_id
			WHERE i.path = ? AND c.status <> 'done'`, child).Scan(&open)
	})
	if err != nil {
		t.Fatal(err)
	}
	if open != 0 {
		t.Fatalf("%d turns of the child not recorded done: its end was refused\n%s", open, s.k.logs.String())
	}
}

// TestAwaitFollowsTheChildsCurrentCopy (issue 24, TestPostgresRestart-
// DuringFanOut: one run of 500 ended "Agent tool run failed" although its
// child completed): the child's node lost the child's shard and took it
// back at a new epoch while the child's turn ran, so the copy the parent
// awaited was dropped and its end refused by the fence. The parent follows
// the run on the copy the runtime serves now, which recovers the turn, and
// gets the child's answer; before, it ended the run with what the dropped
// copy had recorded (a turn still running), as an error.
func TestAwaitFollowsTheChildsCurrentCopy(t *testing.T) {
	s := startStale(t)
	ctx := testCtx(t)
	parent, err := s.e.RT.Get(ctx, s.path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan runOutcome, 1)
	go func() {
		res, err := agenttool.RunAgentTool(ctx, parent, "Leaf", agenttool.RunOptions{RunID: "r3", Input: treeInput{Query: "q"}})
		done <- runOutcome{res, err}
	}()
	<-s.leaf.entered // the child's turn runs
	child := s.path.Child("Leaf", "r3")
	s.place.children.Store(2)
	s.e.RT.Drop(func(p agent.Path) bool { return p.String() == child.String() })
	close(s.leaf.release) // the dropped copy's turn goes on; its end is refused
	var o runOutcome
	select {
	case o = <-done:
	case <-ctx.Done():
		t.Fatal("the parent never returned")
	}
	if o.err != nil || o.res.Status != agenttool.StatusCompleted || o.res.Summary != "leaf answer" {
		t.Fatalf("dispatch: %+v %v, want completed with the child's answer\n%s", o.res, o.err, s.k.logs.String())
	}
	if got := parent.(*countingParent).deliveries(t); got["r3"] != "completed×1" || len(got) != 1 {
		t.Fatalf("finish hook ledger %v, want r3 delivered once (completed×1)", got)
	}
	s.checkDelivered(t, "r3")
	if n := s.leaf.calls.Load(); n != 2 {
		t.Fatalf("the child's model was called %d times, want 2 (the dropped copy's turn and its recovery)", n)
	}
}
