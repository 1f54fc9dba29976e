package agenttool_test

import (
	"context"
	"encoding/json"
	"iter"
	"strings"
	"testing"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
)

// fixedUsage reports the same usage for every model call.
type fixedUsage struct {
	model.Model
	in, out int
}

func (m fixedUsage) Stream(ctx context.Context, req *model.Request) iter.Seq2[model.Event, error] {
	return func(yield func(model.Event, error) bool) {
		for ev, err := range m.Model.Stream(ctx, req) {
			if ev.Kind == model.EventFinish {
				ev.Usage = model.Usage{InputTokens: m.in, OutputTokens: m.out}
			}
			if !yield(ev, err) {
				return
			}
		}
	}
}

// delegating calls tool once and answers with done after its result.
func delegating(tool, done string, in, out int) model.Model {
	return fixedUsage{Model: scripted.New(
		scripted.WithRules(scripted.Rule{Name: "after", Match: scripted.LastIsToolResult,
			Reply: scripted.Always(scripted.Reply{scripted.Text(done)})}),
		scripted.WithDefault(scripted.Always(scripted.Reply{scripted.ToolCall(tool, map[string]string{"query": "q"})})),
	), in: in, out: out}
}

type treeInput struct {
	Query string `json:"query"`
}

// treeAgent is a declarative chat agent of the three-level tree.
type treeAgent struct {
	chat.Base
	m     model.Model
	tools []chat.Tool
}

func (a *treeAgent) ChatModel() model.Model { return a.m }
func (a *treeAgent) Tools() []chat.Tool     { return a.tools }

// startTree runs Root → Mid → Leaf: Root's model calls cost 1+2 tokens
// each, Mid's 10+20, Leaf's 100+200. Root's tool to Mid has budget b;
// leafTools are Leaf's tools (its model calls "wait" when it has one).
func startTree(t *testing.T, b agenttool.TokenBudget, leafTools []chat.Tool) *testenv.Env {
	t.Helper()
	leafModel := fixedUsage{Model: scripted.New(scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text("leaf answer")}))), in: 100, out: 200}
	if len(leafTools) > 0 {
		leafModel = fixedUsage{Model: scripted.New(scripted.WithDefault(scripted.Always(scripted.Reply{scripted.ToolCall("wait", map[string]any{})}))), in: 100, out: 200}
	}
	return testenv.Start(t, testenv.Options{
		Classes: []agent.Class{
			{Name: "Root", Public: true, New: func() agent.Agent {
				return &treeAgent{m: delegating("mid", "root done", 1, 2),
					tools: []chat.Tool{agenttool.AgentTool[treeInput]("Mid", agenttool.ToolOptions{Name: "mid", Tokens: b})}}
			}},
			{Name: "Mid", New: func() agent.Agent {
				return &treeAgent{m: delegating("leaf", "mid done", 10, 20),
					tools: []chat.Tool{agenttool.AgentTool[treeInput]("Leaf", agenttool.ToolOptions{Name: "leaf"})}}
			}},
			{Name: "Leaf", New: func() agent.Agent { return &treeAgent{m: leafModel, tools: leafTools} }},
		},
		Setup: func(rt *agent.Runtime) error {
			chat.Configure(rt, chat.Config{})
			agenttool.Install(rt, agenttool.Options{})
			return nil
		},
	})
}

func lastAssistant(t *testing.T, a agent.Agent) message.Message {
	t.Helper()
	msgs := a.(interface{ Messages() []message.Message }).Messages()
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == message.RoleAssistant {
			return msgs[i]
		}
	}
	t.Fatalf("no assistant message in %+v", msgs)
	return message.Message{}
}

func onlyRun(t *testing.T, ctx context.Context, a agent.Agent) agenttool.Run {
	t.Helper()
	runs, err := agenttool.ListAgentToolRuns(ctx, a)
	if err != nil || len(runs) != 1 {
		t.Fatalf("runs = %+v, %v", runs, err)
	}
	return runs[0]
}

func u(in, out int) chat.Usage {
	return chat.Usage{InputTokens: in, OutputTokens: out, TotalTokens: in + out}
}

// TestUsageRollsUpTree: in a three-level tree each level's messages carry
// their own usage and their tree usage (their own plus everything below),
// each agent-tool run records its child's tree usage, and the root turn's
// tree usage is the sum of all three levels.
func TestUsageRollsUpTree(t *testing.T) {
	env := startTree(t, agenttool.TokenBudget{}, nil)
	ctx := testCtx(t)
	root, err := env.RT.Get(ctx, agent.Root("Root", "r"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := root.(*treeAgent).SaveMessages(ctx, []message.Message{userMsg("go")})
	if err != nil || res.Outcome != chat.OutcomeCompleted || res.Text() != "root done" {
		t.Fatalf("root turn: %v %+v", err, res)
	}
	leafOwn, midOwn, rootOwn := u(100, 200), u(2*10, 2*20), u(2*1, 2*2)
	midTree := midOwn.Add(leafOwn)
	rootTree := rootOwn.Add(midTree)

	midRun := onlyRun(t, ctx, root)
	mid, err := env.RT.Get(ctx, agent.BaseOf(root).Path().Child("Mid", midRun.RunID))
	if err != nil {
		t.Fatal(err)
	}
	leafRun := onlyRun(t, ctx, mid)
	leaf, err := env.RT.Get(ctx, agent.BaseOf(mid).Path().Child("Leaf", leafRun.RunID))
	if err != nil {
		t.Fatal(err)
	}
	for _, lv := range []struct {
		name       string
		msg        message.Message
		own, tree  chat.Usage
		run        *agenttool.Run
		runRecords chat.Usage
	}{
		{"leaf", lastAssistant(t, leaf), leafOwn, leafOwn, &leafRun, leafOwn},
		{"mid", lastAssistant(t, mid), midOwn, midTree, &midRun, midTree},
		{"root", res.Message, rootOwn, rootTree, nil, chat.Usage{}},
	} {
		md := chat.MessageMetadata(lv.msg)
		if md.Usage == nil || *md.Usage != lv.own || md.TreeUsage == nil || *md.TreeUsage != lv.tree {
			t.Errorf("%s message: usage %+v tree %+v, want %+v and %+v", lv.name, md.Usage, md.TreeUsage, lv.own, lv.tree)
		}
		if lv.run != nil && (lv.run.Usage == nil || *lv.run.Usage != lv.runRecords) {
			t.Errorf("%s run records usage %+v, want %+v", lv.name, lv.run.Usage, lv.runRecords)
		}
	}
	// Each message also says which run used what.
	if got := chat.MessageMetadata(lastAssistant(t, mid)).ChildUsage; len(got) != 1 || got[leafRun.RunID] != leafOwn {
		t.Errorf("mid's child usage %+v, want %s: %+v", got, leafRun.RunID, leafOwn)
	}
	if got := chat.MessageMetadata(res.Message).ChildUsage; len(got) != 1 || got[midRun.RunID] != midTree {
		t.Errorf("root's child usage %+v, want %s: %+v", got, midRun.RunID, midTree)
	}
	if res.Usage != rootOwn || res.TreeUsage != rootTree {
		t.Errorf("root result usage %+v tree %+v, want %+v and %+v", res.Usage, res.TreeUsage, rootOwn, rootTree)
	}
	if rootTree.TotalTokens != 6+60+300 {
		t.Errorf("tree total %d, want %d", rootTree.TotalTokens, 6+60+300)
	}
}

// TestTreeBudgetStopsRun: Root's tool gives each Mid run a tree budget of
// 50 tokens. Mid's own first call (30) fits; once its Leaf reports its
// call (300) while it still works, the tree is over the budget: Root
// stops the run, which ends interrupted with reason budget-exceeded (not
// retryable), its child and grandchild canceled, its usage recorded, and
// Root's model reads the failure and answers. A per-run budget of 20
// stops the run at Mid's own first call.
func TestTreeBudgetStopsRun(t *testing.T) {
	for _, tc := range []struct {
		name   string
		budget agenttool.TokenBudget
		usage  chat.Usage
		text   string
	}{
		{"tree", agenttool.TokenBudget{MaxTreeTokens: 50}, u(10, 20).Add(u(100, 200)), "tree used 330 tokens, over its budget of 50"},
		{"own", agenttool.TokenBudget{MaxTokens: 20}, u(10, 20), "used 30 tokens, over its budget of 20"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wait := chat.NewTool("wait", "Waits until canceled.", func(ctx context.Context, in struct{}) (string, error) {
				err := agent.Await(ctx, func() error { <-ctx.Done(); return ctx.Err() })
				return "", err
			})
			env := startTree(t, tc.budget, []chat.Tool{wait})
			ctx := testCtx(t)
			root, err := env.RT.Get(ctx, agent.Root("Root", "b"))
			if err != nil {
				t.Fatal(err)
			}
			res, err := root.(*treeAgent).SaveMessages(ctx, []message.Message{userMsg("go")})
			if err != nil || res.Outcome != chat.OutcomeCompleted || res.Text() != "root done" {
				t.Fatalf("root turn: %v %+v", err, res)
			}
			run := onlyRun(t, ctx, root)
			if run.Status != agenttool.StatusInterrupted || run.Reason != agenttool.ReasonBudgetExceeded ||
				!strings.Contains(run.Error, tc.text) {
				t.Fatalf("run = %+v", run)
			}
			// A per-run stop races with the leaf's first report (which
			// may reach Mid before the cancel does); the tree stop does
			// not: Mid waits for its leaf, which waits to be canceled.
			if run.Usage == nil || (*run.Usage != tc.usage && (tc.name == "tree" || *run.Usage != tc.usage.Add(u(100, 200)))) {
				t.Errorf("run usage %+v, want %+v", run.Usage, tc.usage)
			}
			// The model got the structured failure.
			var failure agenttool.Failure
			for _, p := range res.Message.Parts {
				if p.Type == "tool-mid" {
					_ = json.Unmarshal(p.Output, &failure)
				}
			}
			if failure.OK || failure.Status != agenttool.StatusInterrupted || failure.Reason != agenttool.ReasonBudgetExceeded || failure.Retryable {
				t.Errorf("tool output %+v", failure)
			}
			mid, err := env.RT.Get(ctx, agent.BaseOf(root).Path().Child("Mid", run.RunID))
			if err != nil {
				t.Fatal(err)
			}
			if tc.name == "tree" {
				leafRun := onlyRun(t, ctx, mid)
				if leafRun.Status != agenttool.StatusAborted {
					t.Errorf("leaf run %+v, want aborted with its parent", leafRun)
				}
			}
		})
	}
}
