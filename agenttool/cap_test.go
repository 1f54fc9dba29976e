package agenttool_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/agentry/agentry/agenttool"
)

// Group J (MC): MaxConcurrentAgentTools.

// TestConcurrencyCap covers scenarios 144 and 145 and deliberate
// difference 6: with a cap of 2 and two runs held mid-stream, a third
// dispatch is refused with *CapError, leaves no row and fires no hook;
// once the two finish, the same run id is dispatched again and completes,
// and a new batch of two completes.
func TestConcurrencyCap(t *testing.T) {
	k, fake := heldKit()
	k.cap = 2
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "p144")
	ws := dial(t, env, "assistant/p144")
	o1 := goRun(ctx, a, "Researcher", agenttool.RunOptions{Input: "1", RunID: "c1"})
	o2 := goRun(ctx, a, "Researcher", agenttool.RunOptions{Input: "2", RunID: "c2"})
	waitHeld(t, ctx, fake, 2)

	res, err := agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{Input: "3", RunID: "c3"})
	var ce *agenttool.CapError
	if !errors.As(err, &ce) || ce.Max != 2 || err.Error() != "maxConcurrentAgentTools (2) exceeded" {
		t.Fatalf("third dispatch: %+v, %v", res, err)
	}
	if res.Status != agenttool.StatusError || res.Error != "maxConcurrentAgentTools (2) exceeded" || res.RunID != "c3" {
		t.Fatalf("refused result = %+v", res)
	}
	if _, ok, _ := agenttool.GetAgentToolRun(ctx, a, "c3"); ok {
		t.Fatal("a refused dispatch wrote a row")
	}
	if n := k.rec.startCount(); n != 2 {
		t.Fatalf("%d start hooks, want 2", n)
	}
	if has, _ := agenttool.HasAgentToolRun(ctx, a, "Researcher", "c3"); has {
		t.Fatal("the refused run is in the registry")
	}

	stop := pump(fake)
	defer stop()
	for _, o := range []chan runOut{o1, o2} {
		if r := recv(t, ctx, o); r.Status != agenttool.StatusCompleted {
			t.Fatalf("held run: %+v", r)
		}
	}
	// The refused id was not consumed.
	res, err = agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{Input: "3", RunID: "c3"})
	if err != nil || res.Status != agenttool.StatusCompleted {
		t.Fatalf("re-dispatch of the refused id: %+v, %v", res, err)
	}
	// Slots are free again: a new batch of two completes.
	o4 := goRun(ctx, a, "Researcher", agenttool.RunOptions{Input: "4", RunID: "c4"})
	o5 := goRun(ctx, a, "Researcher", agenttool.RunOptions{Input: "5", RunID: "c5"})
	for _, o := range []chan runOut{o4, o5} {
		if r := recv(t, ctx, o); r.Status != agenttool.StatusCompleted {
			t.Fatalf("second batch: %+v", r)
		}
	}
	// The refused dispatch sent nothing to the clients: c3's frames are
	// those of its one real run, from sequence 0.
	fs := framesOf(ws.waitFrames(ctx, "c3 terminal", terminated("c3")), "c3")
	checkSequences(t, fs)
	if fs[len(fs)-1].Event.Kind != "finished" {
		t.Fatalf("c3 frames:\n%s", dumpFrames(fs))
	}
}

// TestDefaultCapIsUnlimited covers scenario 146.
func TestDefaultCapIsUnlimited(t *testing.T) {
	k, fake := heldKit()
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "p146")
	var outs []chan runOut
	for i := 0; i < 4; i++ {
		outs = append(outs, goRun(ctx, a, "Researcher", agenttool.RunOptions{Input: "x", RunID: fmt.Sprint("u", i)}))
	}
	waitHeld(t, ctx, fake, 4) // all four run at once
	stop := pump(fake)
	defer stop()
	for _, o := range outs {
		if r := recv(t, ctx, o); r.Status != agenttool.StatusCompleted {
			t.Fatalf("run: %+v", r)
		}
	}
}

// TestCapCountsOnlyActiveRuns covers scenarios 147 and 148: an
// interrupted row does not hold a slot, a running one does.
func TestCapCountsOnlyActiveRuns(t *testing.T) {
	k := newKit()
	k.cap = 1
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "p147")
	now := env.RT.Clock().Now()
	seed(t, env, a, seedRow{RunID: "soft", AgentType: "Researcher", Status: "interrupted", Reason: "no-progress", Still: ptr(true), StartedAt: now, Marks: "[0]"})
	seed(t, env, a, seedRow{RunID: "hard", AgentType: "Researcher", Status: "error", Error: "x", StartedAt: now, Marks: "[0]"})
	res, err := agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{Input: researchInput{Query: "q"}, RunID: "new"})
	if err != nil || res.Status != agenttool.StatusCompleted {
		t.Fatalf("with an interrupted row: %+v, %v", res, err)
	}
	seed(t, env, a, seedRow{RunID: "busy", AgentType: "Researcher", Status: "running", StartedAt: now})
	_, err = agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{Input: "q", RunID: "new2"})
	var ce *agenttool.CapError
	if !errors.As(err, &ce) || err.Error() != "maxConcurrentAgentTools (1) exceeded" {
		t.Fatalf("with a running row: %v", err)
	}
}
