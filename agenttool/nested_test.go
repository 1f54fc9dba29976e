package agenttool_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/model/scripted"
)

// Group J (NE): nested agent tools, and drill-in at two levels.

// TestNestedAgentTools covers scenarios 149 and 150: a child that runs an
// agent tool itself owns that run in its own registry; the grandparent's
// clients see only the middle run, the middle's clients (reached by
// drill-in over a real WebSocket) see the grandchild's, and the grandchild
// is reachable two levels down while the middle's registry holds it.
func TestNestedAgentTools(t *testing.T) {
	k := newKit()
	k.middle = func(ctx context.Context, self agent.Agent, tt *chat.Turn) error {
		res, err := agenttool.RunAgentTool(ctx, self, "Researcher", agenttool.RunOptions{
			Input: researchInput{Query: "deep"}, RunID: agent.BaseOf(self).Name() + "-grandchild"})
		if err != nil {
			return err
		}
		return tt.WriteText("middle saw: " + res.Summary)
	}
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "pn")
	top := dial(t, env, "assistant/pn")
	res, err := agenttool.RunAgentTool(ctx, a, "Middle", agenttool.RunOptions{Input: "go", RunID: "mid"})
	if err != nil || res.Status != agenttool.StatusCompleted || res.Summary != "middle saw: Findings for deep" {
		t.Fatalf("middle run = %+v, %v", res, err)
	}
	// The grandparent's clients saw the middle run only.
	fs := top.waitFrames(ctx, "middle terminal", terminated("mid"))
	for _, f := range fs {
		if f.Event.RunID != "mid" {
			t.Fatalf("grandparent got a frame of %s", f.Event.RunID)
		}
	}
	runs, _ := agenttool.ListAgentToolRuns(ctx, a)
	if len(runs) != 1 || runs[0].RunID != "mid" {
		t.Fatalf("grandparent registry = %+v", runs)
	}
	// The middle owns the grandchild run.
	mid := childOf[*middle](t, env, a, "Middle", "mid")
	mruns, err := agenttool.ListAgentToolRuns(ctx, mid)
	if err != nil || len(mruns) != 1 || mruns[0].RunID != "mid-grandchild" || mruns[0].Status != agenttool.StatusCompleted ||
		mruns[0].AgentType != "Researcher" {
		t.Fatalf("middle registry = %+v, %v", mruns, err)
	}
	if fin := k.middleRec.finishesOf("mid-grandchild"); len(fin) != 1 {
		t.Fatalf("middle finish hooks = %+v", fin)
	}
	if fin := k.rec.finishesOf("mid-grandchild"); len(fin) != 0 {
		t.Fatal("the grandparent's hook saw the grandchild")
	}

	// Drill-in, level 1: the middle's own connection replays the
	// grandchild run.
	midWS := dial(t, env, "assistant/pn/sub/middle/mid")
	gfs := framesOf(midWS.waitFrames(ctx, "grandchild replay", terminated("mid-grandchild")), "mid-grandchild")
	checkSequences(t, gfs)
	if textOf(gfs) != "Findings for deep" {
		t.Fatalf("grandchild text %q", textOf(gfs))
	}
	// Level 2: the grandchild's chat, over a WebSocket and over HTTP.
	gpath := "assistant/pn/sub/middle/mid/sub/researcher/mid-grandchild"
	gws := dial(t, env, gpath)
	raw := gws.waitRaw(ctx, "the transcript", func(s string) bool { return strings.Contains(s, `"cf_agent_chat_messages"`) })
	var mf struct {
		Messages []message.Message `json:"messages"`
	}
	_ = json.Unmarshal([]byte(raw), &mf)
	if len(mf.Messages) != 2 || chat.MessageText(mf.Messages[1]) != "Findings for deep" {
		t.Fatalf("grandchild transcript over the socket: %s", raw)
	}
	msgs := getMessages(t, env, gpath)
	if len(msgs) != 2 || msgs[0].Role != message.RoleUser || !strings.Contains(msgs[0].Parts[0].Text, "deep") {
		t.Fatalf("grandchild transcript over HTTP: %+v", msgs)
	}
	// A guessed grandchild id is refused at level 2 and creates nothing.
	guess := "assistant/pn/sub/middle/mid/sub/researcher/guess"
	if code := httpStatus(t, env, guess+"/get-messages"); code != http.StatusNotFound {
		t.Fatalf("guessed grandchild: %d", code)
	}
	if ok, _ := env.RT.Exists(ctx, agent.BaseOf(mid).Path().Child("Researcher", "guess")); ok {
		t.Fatal("a guessed grandchild was created")
	}
}

// TestNestedCapPerLevel covers scenario 151: the middle's own cap of 1
// refuses its second concurrent grandchild, whatever the grandparent's
// runs.
func TestNestedCapPerLevel(t *testing.T) {
	k := newKit()
	fake := clockwork.NewFakeClock()
	k.researcher = heldModel(fake, scripted.Always(scripted.Reply{scripted.Text("grandchild answer")}))
	k.cap, k.middleCap = 1, 1
	refused := make(chan error, 1)
	k.middle = func(ctx context.Context, self agent.Agent, tt *chat.Turn) error {
		first := goRun(ctx, self, "Researcher", agenttool.RunOptions{Input: "1", RunID: "g1"})
		select {
		case <-k.middleRec.started:
		case <-ctx.Done():
			return ctx.Err()
		}
		_, err := agenttool.RunAgentTool(ctx, self, "Researcher", agenttool.RunOptions{Input: "2", RunID: "g2"})
		refused <- err
		stop := pump(fake)
		defer stop()
		o := <-first
		if o.err != nil {
			return o.err
		}
		return tt.WriteText("first: " + string(o.res.Status))
	}
	env := startKit(t, k, agenttool.Options{})
	ctx := testCtx(t)
	a := getAssistant(t, env, "pcap")
	res, err := agenttool.RunAgentTool(ctx, a, "Middle", agenttool.RunOptions{Input: "go", RunID: "mid"})
	if err != nil || res.Summary != "first: completed" {
		t.Fatalf("middle = %+v, %v", res, err)
	}
	var ce *agenttool.CapError
	if err := <-refused; !errors.As(err, &ce) || err.Error() != "maxConcurrentAgentTools (1) exceeded" {
		t.Fatalf("second grandchild: %v", err)
	}
	mid := childOf[*middle](t, env, a, "Middle", "mid")
	mruns, _ := agenttool.ListAgentToolRuns(ctx, mid)
	if len(mruns) != 1 || mruns[0].RunID != "g1" || mruns[0].Status != agenttool.StatusCompleted {
		t.Fatalf("middle registry = %+v", mruns)
	}
}
