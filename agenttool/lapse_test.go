package agenttool_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/model/scripted"
	"github.com/agentry/agentry/store"
)

// lapsingPlacement owns every instance at epoch 1, and refuses the next
// writes of armed paths as package cluster's fence does while a lease is
// past its node's local deadline and not renewed yet: ErrNotOwner, and
// undecided (store.ErrUndecided). The lease is then renewed, same epoch:
// the writes after pass.
type lapsingPlacement struct {
	mu      sync.Mutex
	pending map[string]int // path → refusals left
	refused map[string]int // path → refusals made
}

func newLapsingPlacement() *lapsingPlacement {
	return &lapsingPlacement{pending: map[string]int{}, refused: map[string]int{}}
}

// lapse arms n refusals of the writes of path.
func (p *lapsingPlacement) lapse(path agent.Path, n int) {
	p.mu.Lock()
	p.pending[path.String()] += n
	p.mu.Unlock()
}

func (p *lapsingPlacement) refusals(path agent.Path) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused[path.String()]
}

func (p *lapsingPlacement) Owns(agent.Path) bool           { return true }
func (p *lapsingPlacement) Epoch(agent.Path) (int64, bool) { return 1, true }
func (p *lapsingPlacement) Fence(ctx context.Context, tx store.Tx, path agent.Path, epoch int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pending[path.String()] > 0 {
		p.pending[path.String()]--
		p.refused[path.String()]++
		return fmt.Errorf("test fence %s: lease past its local deadline: %w: %w", path, agent.ErrNotOwner, store.ErrUndecided)
	}
	return nil
}

// lapseParent is a parent whose OnAgentToolFinish records each run's end
// in its own table, through its context (the delivery's mark rides that
// transaction). When lapseHook is set, the hook arms one undecided
// refusal of its own instance's writes first, as a lease lapsing under
// the hook does.
type lapseParent struct {
	chat.Base
	place     *lapsingPlacement
	lapseHook bool
}

func (p *lapseParent) OnStart(ctx context.Context) error {
	return p.Storage().Update(ctx, func(s *agent.SQL) error {
		_, err := s.Exec(`CREATE TABLE IF NOT EXISTS {finishes} (run_id TEXT PRIMARY KEY, status TEXT NOT NULL)`)
		return err
	})
}

func (p *lapseParent) OnAgentToolFinish(ctx context.Context, run agenttool.Run, res agenttool.Result) {
	if p.lapseHook {
		p.place.lapse(p.Path(), 1)
	}
	err := p.Storage().Update(ctx, func(s *agent.SQL) error {
		_, err := s.Exec(`INSERT INTO {finishes} (run_id, status) VALUES (?, ?)`, run.RunID, string(res.Status))
		return err
	})
	if err != nil {
		p.Logger().Error("test: record finish", "run", run.RunID, "err", err)
	}
}

func (p *lapseParent) finishes(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := p.Storage().View(context.Background(), func(s *agent.SQL) error {
		rows, err := s.Query(`SELECT run_id, status FROM {finishes}`)
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

// startLapsing starts one node on PostgreSQL whose placement lapses on
// demand; the child Leaf's model waits for leaf.release on its first call.
func startLapsing(t *testing.T, place *lapsingPlacement, leaf *gatedModel, lapseHook bool) *testenv.Env {
	t.Helper()
	t.Setenv("AGENTRY_TEST_STORE", "postgres")
	k := newKit()
	classes := []agent.Class{
		{Name: "Root", Public: true, New: func() agent.Agent { return &lapseParent{place: place, lapseHook: lapseHook} }},
		{Name: "Leaf", New: func() agent.Agent { return &treeAgent{m: leaf} }},
	}
	return startEnv(t, testenv.Options{Postgres: &pg, Dir: t.TempDir(), Classes: classes, Placement: place, Logger: k.logs.Logger()},
		chat.Config{}, agenttool.Options{}, nil)
}

// TestLapsedLeaseDoesNotAbortTheChild: the child's writes are refused
// while its node's lease is past its local deadline, and the lease is then
// renewed under the same epoch (TestPostgresRestartDuringFanOut: a
// PostgreSQL restart shorter than a lease). The refusal is undecided, so
// the child's turn waits it out and the run completes with the child's
// answer. Before, each refusal was final: here the run ended "Agent tool
// run failed"; in the fault test, refused chunks aborted the turn and its
// end committed "aborted" under the renewed lease, so the run ended
// aborted (one run in 500, "agent tool run was cancelled", which read as
// a cancellation by the parent's request).
func TestLapsedLeaseDoesNotAbortTheChild(t *testing.T) {
	place := newLapsingPlacement()
	leaf := &gatedModel{Model: scripted.New(scripted.WithChunkSize(4),
		scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text("leaf answer after the lapse")}))),
		entered: make(chan struct{}), release: make(chan struct{})}
	e := startLapsing(t, place, leaf, false)
	ctx := testCtx(t)
	root, err := e.RT.Get(ctx, agent.Root("Root", "m"))
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan agenttool.Result, 1)
	go func() {
		out, err := agenttool.RunAgentTool(ctx, root, "Leaf", agenttool.RunOptions{RunID: "lapse-1", Input: treeInput{Query: "q"}})
		if err != nil {
			t.Errorf("RunAgentTool: %v", err)
		}
		res <- out
	}()
	<-leaf.entered
	child := agent.BaseOf(root).Path().Child("Leaf", "lapse-1")
	place.lapse(child, 2) // the child's next writes: its chunks, or its end
	close(leaf.release)
	var out agenttool.Result
	select {
	case out = <-res:
	case <-ctx.Done():
		t.Fatal("the run never ended")
	}
	if n := place.refusals(child); n != 2 {
		t.Fatalf("%d writes of the child refused, want 2 (the test's lapse did not happen)", n)
	}
	if out.Status != agenttool.StatusCompleted || out.Summary != "leaf answer after the lapse" {
		t.Fatalf("run result %+v, want completed with the child's answer", out)
	}
	if got := root.(*lapseParent).finishes(t); got["lapse-1"] != "completed" || len(got) != 1 {
		t.Fatalf("finish hook ledger %v, want lapse-1 completed", got)
	}
}

// TestLapsedLeaseUnderFinishHook: the parent's lease lapses while its
// OnAgentToolFinish writes, and is renewed under the same epoch: the
// parent's hydration stays the current one, so no later start would
// deliver the end again. The hook's write waits the lapse out and commits
// with the delivery mark: delivered once. Before, the write was refused,
// the hook could only log it, and the end stayed undelivered until the
// parent's next start or a repeated dispatch (TestPostgresRestartDuring-
// FanOut: 499 of 500 finish hooks).
func TestLapsedLeaseUnderFinishHook(t *testing.T) {
	place := newLapsingPlacement()
	leaf := &gatedModel{Model: scripted.New(scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text("leaf answer")}))),
		entered: make(chan struct{}), release: make(chan struct{})}
	close(leaf.release)
	e := startLapsing(t, place, leaf, true)
	ctx := testCtx(t)
	root, err := e.RT.Get(ctx, agent.Root("Root", "h"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := agenttool.RunAgentTool(ctx, root, "Leaf", agenttool.RunOptions{RunID: "hook-1", Input: treeInput{Query: "q"}})
	if err != nil || out.Status != agenttool.StatusCompleted {
		t.Fatalf("RunAgentTool: %+v %v", out, err)
	}
	if n := place.refusals(agent.BaseOf(root).Path()); n != 1 {
		t.Fatalf("%d writes of the parent refused, want 1 (the hook's)", n)
	}
	if got := root.(*lapseParent).finishes(t); got["hook-1"] != "completed" || len(got) != 1 {
		t.Fatalf("finish hook ledger %v, want hook-1 completed", got)
	}
	var delivered bool
	if err := e.RT.DB().View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT finish_delivered_at IS NOT NULL FROM agent_tool_runs WHERE run_id = ?`, "hook-1").Scan(&delivered)
	}); err != nil {
		t.Fatal(err)
	}
	if !delivered {
		t.Fatal("the end of hook-1 is not marked delivered: the next start would deliver it again")
	}
}

// TestLapsedParentLeaseUnderFusedEnd: the parent's lease lapses while the
// child's turn ends, and is renewed under the same epoch. The child's end
// transaction, which records the parent's end too (the fuse), meets the
// parent's undecided fence and is run again by the store; the attempt
// that commits records the parent's end, and the parent takes it and
// delivers it once. Before, the attempt run again did not claim the fuse
// an earlier attempt had claimed: the child's end committed without the
// parent's row, the parent took the fuse's empty result and answered the
// run's row as it stood (running), and the run never ended.
func TestLapsedParentLeaseUnderFusedEnd(t *testing.T) {
	place := newLapsingPlacement()
	leaf := &gatedModel{Model: scripted.New(scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text("leaf answer")}))),
		entered: make(chan struct{}), release: make(chan struct{})}
	e := startLapsing(t, place, leaf, false)
	ctx := testCtx(t)
	root, err := e.RT.Get(ctx, agent.Root("Root", "f"))
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan runOutcome, 1)
	go func() {
		out, err := agenttool.RunAgentTool(ctx, root, "Leaf", agenttool.RunOptions{RunID: "fused-1", Input: treeInput{Query: "q"}})
		res <- runOutcome{out, err}
	}()
	<-leaf.entered
	parent := agent.BaseOf(root).Path()
	// The parent's next write is its end, in the child's end transaction:
	// it awaits the run and writes nothing meanwhile.
	place.lapse(parent, 1)
	close(leaf.release)
	var o runOutcome
	select {
	case o = <-res:
	case <-ctx.Done():
		t.Fatal("the run never ended")
	}
	if n := place.refusals(parent); n != 1 {
		t.Fatalf("%d writes of the parent refused, want 1 (the fused end's)", n)
	}
	if o.err != nil || o.res.Status != agenttool.StatusCompleted || o.res.Summary != "leaf answer" {
		t.Fatalf("run result %+v %v, want completed with the child's answer", o.res, o.err)
	}
	if got := root.(*lapseParent).finishes(t); got["fused-1"] != "completed" || len(got) != 1 {
		t.Fatalf("finish hook ledger %v, want fused-1 completed", got)
	}
	var status string
	var delivered bool
	if err := e.RT.DB().View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT status, finish_delivered_at IS NOT NULL FROM agent_tool_runs WHERE run_id = ?`, "fused-1").Scan(&status, &delivered)
	}); err != nil {
		t.Fatal(err)
	}
	if status != "completed" || !delivered {
		t.Fatalf("fused-1 recorded %s, delivered=%v: want completed and delivered", status, delivered)
	}
}
