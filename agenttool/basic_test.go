package agenttool_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/internal/testenv"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type researchInput struct {
	Query string `json:"query"`
}

type researcher struct{ chat.Base }

func (r *researcher) ChatModel() model.Model {
	return scripted.New(scripted.WithDefault(func(req *model.Request) scripted.Reply {
		var in researchInput
		_ = json.Unmarshal([]byte(scripted.LastUserText(req)), &in)
		return scripted.Reply{scripted.Text("Findings for " + in.Query)}
	}))
}

type assistant struct{ chat.Base }

func (a *assistant) ChatModel() model.Model {
	return scripted.New(
		scripted.WithRules(scripted.Rule{Match: scripted.LastIsToolResult, Reply: func(req *model.Request) scripted.Reply {
			return scripted.Reply{scripted.Text("Done: " + string(scripted.ToolResults(req)[0].Output))}
		}}),
		scripted.WithDefault(func(req *model.Request) scripted.Reply {
			return scripted.Reply{scripted.ToolCall("research", researchInput{Query: strings.TrimPrefix(scripted.LastUserText(req), "research ")})}
		}))
}

func (a *assistant) Tools() []chat.Tool {
	return []chat.Tool{agenttool.AgentTool[researchInput]("Researcher", agenttool.ToolOptions{Name: "research", Description: "Research a topic", DisplayName: "Researcher"})}
}

func startEnv(t *testing.T) *testenv.Env {
	return testenv.Start(t, testenv.Options{
		Classes: []agent.Class{
			{Name: "Assistant", New: func() agent.Agent { return &assistant{} }},
			{Name: "Researcher", New: func() agent.Agent { return &researcher{} }},
		},
		Setup: func(rt *agent.Runtime) error {
			chat.Configure(rt, chat.Config{})
			agenttool.Install(rt, agenttool.Options{})
			return nil
		},
	})
}

func TestAgentToolEndToEnd(t *testing.T) {
	env := startEnv(t)
	ctx := context.Background()
	got, err := env.RT.Get(ctx, agent.Root("Assistant", "a1"))
	if err != nil {
		t.Fatal(err)
	}
	asst := got.(*assistant)
	res, err := asst.SaveMessages(ctx, []message.Message{{Role: message.RoleUser, Parts: []message.Part{{Type: message.PartText, Text: "research cats"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != chat.OutcomeCompleted || res.Text() != `Done: "Findings for cats"` {
		t.Fatalf("turn = %+v text %q", res, res.Text())
	}
	runs, err := agenttool.ListAgentToolRuns(ctx, asst)
	if err != nil || len(runs) != 1 {
		t.Fatalf("runs = %v, %v", runs, err)
	}
	r := runs[0]
	if r.Status != agenttool.StatusCompleted || r.Summary != "Findings for cats" || !strings.HasPrefix(r.RunID, "agent-tool:") || r.ParentToolCallID == "" {
		t.Fatalf("run = %+v", r)
	}
}
