package agenttool_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/model/scripted"
	"github.com/agentry/agentry/store"
)

// unreachedRemote is nodeRemote whose first starts of a child fail as a
// node call that reached no owner within its window does (a database
// outage: cluster's peer call gives up wrapping store.ErrUnavailable).
type unreachedRemote struct {
	nodeRemote
	failures atomic.Int32 // starts left to fail
}

func (r *unreachedRemote) StartChild(ctx context.Context, req agenttool.RemoteStart) (string, error) {
	if r.failures.Add(-1) >= 0 {
		return "", fmt.Errorf("test: start-child %s: no owner reachable: %w (%w)", req.Child(), context.DeadlineExceeded, store.ErrUnavailable)
	}
	return r.nodeRemote.StartChild(ctx, req)
}

// TestUnreachedRemoteStartLeavesTheRunToItsRedispatch: the start of an
// awaited run's child on another node reaches no owner in time (the
// database was down, the shards changing hands). The dispatch fails with
// that error and the run stays recorded, not ended; the client's repeated
// dispatch of the same run id starts the child and gets its answer.
// Before, the run was ended "timed out" at once, and every repeated
// request got that stored error (TestPostgresRestartDuringFanOut: one run
// in 500, the repeated fan-out never completed).
func TestUnreachedRemoteStartLeavesTheRunToItsRedispatch(t *testing.T) {
	t.Setenv("AGENTRY_TEST_STORE", "postgres")
	dir := t.TempDir()
	moved := &atomic.Bool{}
	moved.Store(true) // every child on node 1, the parent on node 0
	classes := []agent.Class{
		{Name: "Root", Public: true, New: func() agent.Agent { return &treeAgent{m: delegating("leaf", "root done", 1, 2)} }},
		{Name: "Leaf", New: func() agent.Agent {
			return &treeAgent{m: scripted.New(scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text("leaf answer")})))}
		}},
	}
	r := &unreachedRemote{}
	r.failures.Store(1)
	k := newKit()
	start := func(node int) *testenv.Env {
		return startEnv(t, testenv.Options{Postgres: &pg, Dir: dir, Classes: classes, Placement: movingPlacement{node: node, moved: moved}, Logger: k.logs.Logger()},
			chat.Config{}, agenttool.Options{Remote: r, RemotePoll: 20 * time.Millisecond}, nil)
	}
	a := start(0)
	b := start(1)
	r.child = func() *agent.Runtime { return b.RT }
	ctx := testCtx(t)
	root, err := a.RT.Get(ctx, agent.Root("Root", "u"))
	if err != nil {
		t.Fatal(err)
	}
	opts := agenttool.RunOptions{RunID: "unreached-1", Input: treeInput{Query: "q"}}
	if out, err := agenttool.RunAgentTool(ctx, root, "Leaf", opts); err == nil {
		t.Fatalf("dispatch whose child's owner was not reached: %+v, want an error (the run not ended)", out)
	}
	runs, err := agenttool.ListAgentToolRuns(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 || runs[0].Status.Hard() {
		t.Fatalf("runs after the failed start: %+v, want unreached-1 recorded and not ended", runs)
	}
	out, err := agenttool.RunAgentTool(ctx, root, "Leaf", opts)
	if err != nil || out.Status != agenttool.StatusCompleted || out.Summary != "leaf answer" {
		t.Fatalf("repeated dispatch: %+v %v, want completed with the child's answer", out, err)
	}
}
