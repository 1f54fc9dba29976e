package mcpclient_test

import (
	"context"
	"strings"
	"testing"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/mcpclient"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
)

type helpIn struct {
	Query string `json:"query"`
}

// parentBot hands the work to a helper child (an agent tool).
type parentBot struct{ chat.Base }

func (p *parentBot) ChatModel() model.Model {
	return scripted.New(scripted.WithRules(
		scripted.Rule{Match: scripted.LastIsToolResult, Reply: func(req *model.Request) scripted.Reply {
			return scripted.Reply{scripted.Text("parent got: " + string(scripted.ToolResults(req)[0].Output))}
		}},
		scripted.Rule{Reply: scripted.Always(scripted.Reply{scripted.ToolCall("help", helpIn{Query: "q"})})},
	))
}

func (p *parentBot) Tools() []chat.Tool {
	return []chat.Tool{agenttool.AgentTool[helpIn]("Helper", agenttool.ToolOptions{Name: "help"})}
}

// helperBot is the child: it calls the MCP server's echo tool, which
// needs approval, and tells its turns' ends.
type helperBot struct {
	chat.Base
	mcp   *mcpclient.Client
	ended chan chat.TurnResult
}

func (h *helperBot) ChatModel() model.Model {
	return scripted.New(scripted.WithRules(
		scripted.Rule{Match: scripted.LastIsToolResult, Reply: func(req *model.Request) scripted.Reply {
			return scripted.Reply{scripted.Text("helper saw " + string(scripted.ToolResults(req)[0].Output))}
		}},
		scripted.Rule{Reply: scripted.Always(scripted.Reply{scripted.ToolCall("go_echo", map[string]any{"text": "from the child"})})},
	))
}

func (h *helperBot) Tools() []chat.Tool { return h.mcp.Tools() }

func (h *helperBot) OnTurnEnd(ctx context.Context, r chat.TurnResult) { h.ended <- r }

// TestApprovalInChildRun: an MCP tool that needs approval, called by an
// agent-tool child, makes the run wait; the parent answers it
// (AnswerAgentToolApproval), the child calls the server once, and the
// parent's turn completes with the child's answer.
func TestApprovalInChildRun(t *testing.T) {
	g := newGoServer(t)
	mc := newClient(t, nil)
	ctx := testCtx(t)
	if err := mc.AddServer(ctx, mcpclient.Server{Name: "go", URL: g.http.URL, NeedsApproval: chat.RequireApproval}); err != nil {
		t.Fatal(err)
	}
	rt := newRuntime(t)
	if err := agenttool.Install(rt, agenttool.Options{}); err != nil {
		t.Fatal(err)
	}
	ended := make(chan chat.TurnResult, 16)
	for _, c := range []agent.Class{
		{Name: "Parent", Public: true, New: func() agent.Agent { return &parentBot{} }},
		{Name: "Helper", New: func() agent.Agent { return &helperBot{mcp: mc, ended: ended} }},
	} {
		if err := rt.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := rt.Start(ctx); err != nil {
		t.Fatal(err)
	}
	pa, err := rt.Get(ctx, agent.Root("Parent", "p"))
	if err != nil {
		t.Fatal(err)
	}
	parent := pa.(chatter)
	done := make(chan chat.TurnResult, 1)
	go func() {
		res, err := parent.SaveMessages(ctx, []message.Message{userMsg("help me")})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	var waiting chat.TurnResult
	select {
	case waiting = <-ended:
	case <-ctx.Done():
		t.Fatal("the child's turn did not end")
	}
	if len(waiting.Waiting) != 1 || !waiting.Waiting[0].Approval || waiting.Waiting[0].ToolName != "go_echo" {
		t.Fatalf("child turn ended %+v, want waiting for the approval of go_echo", waiting)
	}
	runs, err := agenttool.ListAgentToolRuns(ctx, pa)
	if err != nil || len(runs) != 1 {
		t.Fatalf("runs %+v %v", runs, err)
	}
	select {
	case res := <-done:
		t.Fatalf("the parent's turn ended while its helper waited: %+v", res)
	default:
	}
	if err := agenttool.AnswerAgentToolApproval(ctx, pa, runs[0].RunID, waiting.Waiting[0].ToolCallID, true, ""); err != nil {
		t.Fatal(err)
	}
	var res chat.TurnResult
	select {
	case res = <-done:
	case <-ctx.Done():
		t.Fatal("the parent's turn did not end")
	}
	var text string
	for _, p := range partsOf(res.Message, message.PartText) {
		text += p.Text
	}
	if !strings.Contains(text, "echo: from the child") {
		t.Fatalf("parent answered %q, want the child's MCP result", text)
	}
}
