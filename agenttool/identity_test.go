package agenttool_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
)

// The caller's identity (agent.WithIdentity) reaches the turn of the child
// an agent-tool run starts, awaited or detached: the child's handler runs
// for the caller of the parent's tool.
func TestRunCarriesIdentity(t *testing.T) {
	k := newKit()
	seen := make(chan any, 4)
	k.middle = func(ctx context.Context, self agent.Agent, tt *chat.Turn) error {
		id, _ := agent.IdentityFrom(ctx)
		seen <- id
		return tt.WriteText("done")
	}
	env := startKit(t, k, agenttool.Options{})
	ctx := agent.WithIdentity(testCtx(t), "alice")
	a := getAssistant(t, env, "ident")
	next := func(what string) any {
		t.Helper()
		select {
		case id := <-seen:
			return id
		case <-time.After(waitLimit):
			t.Fatalf("the %s child's handler did not run", what)
			return nil
		}
	}

	res, err := agenttool.RunAgentTool(ctx, a, "Middle", agenttool.RunOptions{Input: "x", RunID: "awaited"})
	if err != nil || res.Status != agenttool.StatusCompleted {
		t.Fatalf("awaited run: %+v, %v", res, err)
	}
	if id := next("awaited"); id != "alice" {
		t.Errorf("awaited child saw identity %v, want alice", id)
	}

	if _, err := agenttool.RunAgentTool(ctx, a, "Middle", agenttool.RunOptions{Input: "y", RunID: "detached",
		Detached: &agenttool.DetachedOptions{}}); err != nil {
		t.Fatalf("detached run: %v", err)
	}
	if id := next("detached"); id != "alice" {
		t.Errorf("detached child saw identity %v, want alice", id)
	}

	if _, err := agenttool.RunAgentTool(testCtx(t), a, "Middle", agenttool.RunOptions{Input: "z", RunID: "anonymous"}); err != nil {
		t.Fatalf("anonymous run: %v", err)
	}
	if id := next("anonymous"); id != nil {
		t.Errorf("a run without an identity gave its child %v", id)
	}
}
