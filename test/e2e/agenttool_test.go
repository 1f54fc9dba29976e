package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/examples/seed"
	"github.com/agentry/agentry/internal/testkit/testenv"
)

// TestAgentTools runs test/npm/agent-tools.mjs against the seed's
// Assistant and Researcher: two runs in parallel under one tool call, fed
// live to the real useAgentToolEvents reducer, rebuilt by a fresh
// connection from the replay alone, and the child's chat reached by
// drill-in.
func TestAgentTools(t *testing.T) {
	env := testenv.Start(t, testenv.Options{
		Classes: seed.Classes(seed.Options{Delay: 5 * time.Millisecond}),
		Setup:   withAgentTools,
	})
	runScript(t, 90*time.Second, "PASS agent-tools", "agent-tools.mjs", env.Host, "e2e")
	// The server side agrees: two completed runs under the tool call, and
	// the guessed child was never created.
	ctx := context.Background()
	parent, err := env.RT.Get(ctx, agent.Root("Assistant", "e2e"))
	if err != nil {
		t.Fatal(err)
	}
	runs, err := agenttool.ListAgentToolRuns(ctx, parent)
	if err != nil || len(runs) != 2 {
		t.Fatalf("runs = %+v, %v", runs, err)
	}
	for _, r := range runs {
		if r.Status != agenttool.StatusCompleted || r.ParentToolCallID != "call_compare_1" {
			t.Errorf("run %+v", r)
		}
	}
	if ok, _ := env.RT.Exists(ctx, agent.Root("Assistant", "e2e").Child("Researcher", "guessed-run")); ok {
		t.Error("the guessed child was created")
	}
}
