package agenttool_test

import (
	"context"
	"fmt"
	"iter"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
	"github.com/agentry/agentry/store"
)

// movingPlacement is a two-node placement whose sub-agents move from node
// 0 (which owns the root instances) to node 1 when moved is set.
type movingPlacement struct {
	node  int
	moved *atomic.Bool
}

func (p movingPlacement) Owns(path agent.Path) bool {
	if len(path) == 1 {
		return p.node == 0
	}
	return (p.node == 1) == p.moved.Load()
}

func (p movingPlacement) Epoch(path agent.Path) (int64, bool) {
	e := int64(1)
	if len(path) > 1 && p.moved.Load() {
		e = 2 // the sub-agents' shard changed hands
	}
	return e, p.Owns(path)
}

func (p movingPlacement) Fence(ctx context.Context, tx store.Tx, path agent.Path, epoch int64) error {
	if e, ok := p.Epoch(path); !ok || e != epoch {
		return fmt.Errorf("test fence %s: %w", path, agent.ErrNotOwner)
	}
	return nil
}

// gatedModel blocks its first call until release is closed (or its
// context ends); the calls after it answer at once.
type gatedModel struct {
	model.Model
	calls   atomic.Int32
	entered chan struct{}
	release chan struct{}
}

func (m *gatedModel) Stream(ctx context.Context, req *model.Request) iter.Seq2[model.Event, error] {
	if m.calls.Add(1) == 1 {
		close(m.entered)
		select {
		case <-m.release:
		case <-ctx.Done():
		}
	}
	return m.Model.Stream(ctx, req)
}

// TestAwaitFollowsAChildThatMoved: a parent awaits a child its own node
// owns; the child's shard moves to another node while the child's turn
// runs, so that turn cannot record its end, and the new owner recovers
// the turn. The parent follows the run to the new owner and gets its
// real result, not an error (TestFaultSchedules found "Agent tool run
// failed" for a run whose child completed after a node joined).
func TestAwaitFollowsAChildThatMoved(t *testing.T) {
	t.Setenv("AGENTRY_TEST_STORE", "postgres")
	dir := t.TempDir()
	moved := &atomic.Bool{}
	leaf := &gatedModel{Model: scripted.New(scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text("leaf answer")}))),
		entered: make(chan struct{}), release: make(chan struct{})}
	classes := []agent.Class{
		{Name: "Root", Public: true, New: func() agent.Agent { return &treeAgent{m: delegating("leaf", "root done", 1, 2)} }},
		{Name: "Leaf", New: func() agent.Agent { return &treeAgent{m: leaf} }},
	}
	r := &nodeRemote{}
	k := newKit()
	start := func(node int) *testenv.Env {
		return startEnv(t, testenv.Options{Postgres: &pg, Dir: dir, Classes: classes, Placement: movingPlacement{node: node, moved: moved}, Logger: k.logs.Logger()},
			chat.Config{}, agenttool.Options{Remote: r, RemotePoll: 20 * time.Millisecond}, nil)
	}
	a := start(0)
	b := start(1)
	r.child = func() *agent.Runtime { return b.RT }

	ctx := testCtx(t)
	root, err := a.RT.Get(ctx, agent.Root("Root", "m"))
	if err != nil {
		t.Fatal(err)
	}
	res := make(chan agenttool.Result, 1)
	go func() {
		out, err := agenttool.RunAgentTool(ctx, root, "Leaf", agenttool.RunOptions{RunID: "moved-1", Input: treeInput{Query: "q"}})
		if err != nil {
			t.Errorf("RunAgentTool: %v", err)
		}
		res <- out
	}()
	<-leaf.entered // the child's turn runs on node 0
	childPath := agent.BaseOf(root).Path().Child("Leaf", "moved-1")
	if _, ok := a.RT.Lookup(childPath); !ok {
		t.Fatal("the child is not resident on the parent's node: the test's placement is wrong")
	}
	// The shard moves: node 0 drops the child (as a node that lost a
	// lease does), node 1 takes it and recovers its turn.
	moved.Store(true)
	a.RT.Drop(func(p agent.Path) bool { return p.String() == childPath.String() })
	close(leaf.release)
	if _, err := b.RT.Get(ctx, childPath); err != nil {
		t.Fatal(err)
	}
	var out agenttool.Result
	select {
	case out = <-res:
	case <-ctx.Done():
		t.Fatal("the parent never got the run's end")
	}
	if out.Status != agenttool.StatusCompleted || out.Summary != "leaf answer" {
		t.Fatalf("run result %+v, want completed with the child's answer from its new node", out)
	}
}
