package agentsastools_test

import (
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/diag"
	agentsastools "github.com/agentry/agentry/examples/agents-as-tools"
	"github.com/agentry/agentry/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func start(t *testing.T) (*testenv.Env, *agentsastools.Assistant) {
	t.Helper()
	env := testenv.Start(t, testenv.Options{
		Classes: agentsastools.Classes(agentsastools.Options{Models: agentsastools.Offline(0, nil)}),
		Setup: func(rt *agent.Runtime) error {
			chat.Configure(rt, chat.Config{})
			agenttool.Install(rt, agenttool.Options{})
			return nil
		},
	})
	a, err := env.RT.Get(context.Background(), agent.Root("Assistant", "demo"))
	if err != nil {
		t.Fatal(err)
	}
	return env, a.(*agentsastools.Assistant)
}

func say(t *testing.T, a *agentsastools.Assistant, text string) chat.TurnResult {
	t.Helper()
	res, err := a.SaveMessages(context.Background(), []message.Message{{Role: message.RoleUser,
		Parts: []message.Part{{Type: message.PartText, Text: text}}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("turn %q: %+v", text, res)
	}
	return res
}

// TestResearchPlanCompare drives the offline demo through its foreground
// tools and checks the registry each one leaves.
func TestResearchPlanCompare(t *testing.T) {
	_, a := start(t)
	ctx := context.Background()
	if got := say(t, a, "Research quantum computing").Text(); !strings.Contains(got, "Quantum computing is worth knowing well") {
		t.Fatalf("research answer %q", got)
	}
	if got := say(t, a, "Plan adding rate limiting to the billing service").Text(); !strings.Contains(got, "## Overview") {
		t.Fatalf("plan answer %q", got)
	}
	if got := say(t, a, "Compare HTTP/3 and gRPC").Text(); !strings.Contains(got, "Side A: HTTP/3") || !strings.Contains(got, "Side B: GRPC") {
		t.Fatalf("compare answer %q", got)
	}
	runs, err := agenttool.ListAgentToolRuns(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	var classes []string
	for _, r := range runs {
		if r.Status != agenttool.StatusCompleted {
			t.Fatalf("run %+v", r)
		}
		classes = append(classes, r.AgentType)
	}
	if strings.Join(classes, ",") != "Researcher,Planner,Researcher,Researcher" {
		t.Fatalf("runs %v", classes)
	}
	if runs[2].ParentToolCallID == "" || runs[2].ParentToolCallID != runs[3].ParentToolCallID ||
		runs[2].DisplayOrder+runs[3].DisplayOrder != 1 {
		t.Fatalf("compare runs %+v %+v", runs[2], runs[3])
	}
}

// TestBackgroundResearch dispatches a detached Researcher and waits for the
// notification turn it causes: a milestone line, the notice and an answer.
func TestBackgroundResearch(t *testing.T) {
	env, a := start(t)
	turns := make(chan struct{}, 8)
	unsub := env.RT.Diag().Subscribe(diag.ChannelChat, func(e diag.Event) {
		if e.Type == "turn" && e.Agent == agent.Root("Assistant", "demo").String() {
			turns <- struct{}{}
		}
	})
	defer unsub()
	got := say(t, a, "Research solar panels in the background").Text()
	if !strings.Contains(got, "in the background") {
		t.Fatalf("dispatch answer %q", got)
	}
	<-turns // the dispatch turn
	<-turns // the notification turn
	msgs := a.Messages()
	var texts []string
	for _, m := range msgs {
		texts = append(texts, string(m.Role)+": "+chat.MessageText(m))
	}
	all := strings.Join(texts, "\n")
	for _, want := range []string{`reached milestone "sources-gathered"`, "Background task \"Researcher\"", "Your background research is done."} {
		if !strings.Contains(all, want) {
			t.Fatalf("transcript lacks %q:\n%s", want, all)
		}
	}
	runs, _ := agenttool.ListAgentToolRuns(context.Background(), a)
	if len(runs) != 1 || runs[0].Status != agenttool.StatusCompleted || runs[0].ParentToolCallID != "" {
		t.Fatalf("runs %+v", runs)
	}
}

func TestTopic(t *testing.T) {
	for in, want := range map[string]string{
		"Research the history of TLS in the background": "the history of TLS",
		"Research solar panels, don't wait":             "solar panels",
		"Please research quantum computing":             "quantum computing",
	} {
		if got := agentsastools.Topic(in); got != want {
			t.Errorf("Topic(%q) = %q, want %q", in, got, want)
		}
	}
}
