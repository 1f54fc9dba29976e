package agentsastools_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/goleak"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/diag"
	agentsastools "github.com/agentry/agentry/examples/agents-as-tools"
	"github.com/agentry/agentry/internal/testkit/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func start(t *testing.T) (*testenv.Env, *agentsastools.Assistant) {
	t.Helper()
	return startWith(t, agentsastools.Options{})
}

// startWith starts the demo's classes with o; nil Models means the offline
// models without delay.
func startWith(t *testing.T, o agentsastools.Options) (*testenv.Env, *agentsastools.Assistant) {
	t.Helper()
	if o.Models == nil {
		o.Models = agentsastools.Offline(0, nil)
	}
	env := testenv.Start(t, testenv.Options{
		Classes: agentsastools.Classes(o),
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
	// The plan is answered whole, its numbered steps included.
	if got := say(t, a, "Plan adding rate limiting to the billing service").Text(); !strings.Contains(got, "## Overview") ||
		!strings.Contains(got, "1. Write a failing test") || !strings.Contains(got, "3. Update the callers") ||
		!strings.Contains(got, "## Open questions") {
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
	for _, want := range []string{`"solar panels" has gathered its sources`, `Background research on "solar panels" finished:`,
		`Your background research on "solar panels" is done. Solar panels is worth knowing well.`} {
		if !strings.Contains(all, want) {
			t.Fatalf("transcript lacks %q:\n%s", want, all)
		}
	}
	// People read the chat: no internal run ids in it.
	if strings.Contains(all, "agent-tool:") || strings.Contains(all, "call_") {
		t.Fatalf("transcript shows a run id:\n%s", all)
	}
	runs, _ := agenttool.ListAgentToolRuns(context.Background(), a)
	if len(runs) != 1 || runs[0].Status != agenttool.StatusCompleted || runs[0].ParentToolCallID != "" {
		t.Fatalf("runs %+v", runs)
	}
	// A background helper is shown under its class's name, so front ends
	// can drill into it, with its query as the preview.
	if runs[0].Display["name"] != "Researcher" || string(runs[0].InputPreview) != `"solar panels"` {
		t.Fatalf("background run display %v, preview %s", runs[0].Display, runs[0].InputPreview)
	}
}

// TestCancelledBackgroundNotice cancels a background run while its search
// waits (on a clock that is never advanced) and checks the answer to the
// notice: it says cancelled, not done.
func TestCancelledBackgroundNotice(t *testing.T) {
	clk := clockwork.NewFakeClock()
	env, a := startWith(t, agentsastools.Options{Clock: clk, SearchTime: time.Hour})
	ctx := context.Background()
	turns := make(chan struct{}, 8)
	unsub := env.RT.Diag().Subscribe(diag.ChannelChat, func(e diag.Event) {
		if e.Type == "turn" && e.Agent == agent.Root("Assistant", "demo").String() {
			turns <- struct{}{}
		}
	})
	defer unsub()
	say(t, a, "Research the history of DNS in the background")
	<-turns                                               // the dispatch turn
	if err := clk.BlockUntilContext(ctx, 1); err != nil { // the search waits
		t.Fatal(err)
	}
	runs, err := agenttool.ListAgentToolRuns(ctx, a)
	if err != nil || len(runs) != 1 {
		t.Fatalf("runs %+v, %v", runs, err)
	}
	if err := a.CancelBackground(ctx, runs[0].RunID); err != nil {
		t.Fatal(err)
	}
	<-turns // the notification turn
	msgs := a.Messages()
	last := chat.MessageText(msgs[len(msgs)-1])
	if want := `The background research on "the history of DNS" was cancelled, so there is no result.`; last != want {
		t.Fatalf("answer to the cancel notice %q, want %q", last, want)
	}
}

// TestSmallTalk: a greeting or a question about the assistant gets the
// help text and starts no helper.
func TestSmallTalk(t *testing.T) {
	_, a := start(t)
	for _, text := range []string{"hello, what can you do?", "Hi", "help"} {
		if got := say(t, a, text).Text(); got != agentsastools.HelpText {
			t.Errorf("%q: answer %q", text, got)
		}
	}
	if runs, err := agenttool.ListAgentToolRuns(context.Background(), a); err != nil || len(runs) != 0 {
		t.Fatalf("small talk started runs: %+v, %v", runs, err)
	}
	// A greeting that asks for work is work.
	if got := say(t, a, "hello, research quantum computing").Text(); !strings.Contains(got, "Quantum computing is worth knowing well") {
		t.Errorf("greeting with a task: %q", got)
	}
}

// TestChildFirstMessage: a helper's chat starts with the query as a person
// would type it, not the tool input's JSON.
func TestChildFirstMessage(t *testing.T) {
	_, a := start(t)
	ctx := context.Background()
	say(t, a, "Research quantum computing")
	say(t, a, "Plan adding rate limiting to the billing service")
	runs, err := agenttool.ListAgentToolRuns(ctx, a)
	if err != nil || len(runs) != 2 {
		t.Fatalf("runs %+v, %v", runs, err)
	}
	for i, want := range []string{"quantum computing", "adding rate limiting to the billing service"} {
		child, err := a.SubAgent(ctx, runs[i].AgentType, runs[i].RunID)
		if err != nil {
			t.Fatal(err)
		}
		msgs := child.(interface{ Messages() []message.Message }).Messages()
		if len(msgs) == 0 || msgs[0].Role != message.RoleUser || chat.MessageText(msgs[0]) != want {
			t.Errorf("%s's first message %+v, want the text %q", runs[i].AgentType, msgs, want)
		}
	}
}

// TestTextHelpers: FirstSentence and Topic on the texts the demo meets.
func TestTextHelpers(t *testing.T) {
	for _, fn := range []struct {
		name  string
		f     func(string) string
		cases map[string]string
	}{
		{"FirstSentence", agentsastools.FirstSentence, map[string]string{
			"One. Two.": "One.",
			"## Step-by-step\n1. Write it.\n2. Run it.": "## Step-by-step\n1. Write it.",
			"Use e.g. Go. Then stop.":                   "Use e.g. Go.",
			"No period":                                 "No period",
			"Ends here.\nNext line.":                    "Ends here.",
			"Version 1.2 is out. Yes.":                  "Version 1.2 is out.",
		}},
		{"Topic", agentsastools.Topic, map[string]string{
			"Research the history of TLS in the background": "the history of TLS",
			"Research solar panels, don't wait":             "solar panels",
			"Please research quantum computing":             "quantum computing",
		}},
	} {
		for in, want := range fn.cases {
			if got := fn.f(in); got != want {
				t.Errorf("%s(%q) = %q, want %q", fn.name, in, got, want)
			}
		}
	}
}

// TestCompareThree fans out to three Researchers under one tool call for
// "compare A, B and C".
func TestCompareThree(t *testing.T) {
	_, a := start(t)
	got := say(t, a, "Compare HTTP/3, gRPC and WebSockets").Text()
	if !strings.Contains(got, "Side A: HTTP/3") || !strings.Contains(got, "Side B: GRPC") || !strings.Contains(got, "Side C: WebSockets") {
		t.Fatalf("compare answer %q", got)
	}
	runs, err := agenttool.ListAgentToolRuns(context.Background(), a)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 3 {
		t.Fatalf("%d runs, want 3", len(runs))
	}
	orders := map[int]bool{}
	for _, r := range runs {
		if r.Status != agenttool.StatusCompleted || r.ParentToolCallID == "" || r.ParentToolCallID != runs[0].ParentToolCallID {
			t.Fatalf("run %+v", r)
		}
		orders[r.DisplayOrder] = true
	}
	if !orders[0] || !orders[1] || !orders[2] {
		t.Fatalf("display orders %v", orders)
	}
}

// TestResearcherToolsShared: every Researcher of one set of classes has
// the same tools (built once for the class: a helper run is a new
// instance), and a second set of classes builds its own.
func TestResearcherToolsShared(t *testing.T) {
	researcher := func(classes []agent.Class) []chat.Tool {
		t.Helper()
		for _, c := range classes {
			if c.Name == "Researcher" {
				return c.New().(chat.ToolProvider).Tools()
			}
		}
		t.Fatal("no Researcher class")
		return nil
	}
	classes := agentsastools.Classes(agentsastools.Options{Models: agentsastools.Offline(0, nil)})
	a, b := researcher(classes), researcher(classes)
	other := researcher(agentsastools.Classes(agentsastools.Options{Models: agentsastools.Offline(0, nil)}))
	if len(a) != 2 || a[0].Name != "web_search" || a[1].Name != "publish_findings" {
		t.Fatalf("Researcher tools %v, want web_search and publish_findings", a)
	}
	for i := range a {
		if a[i].Schema() != b[i].Schema() {
			t.Errorf("%s: two Researchers built their own schema", a[i].Name)
		}
		if a[i].Schema() == other[i].Schema() {
			t.Errorf("%s: two sets of classes share a schema", a[i].Name)
		}
	}
	// A caller appending to one instance's tools changes no other's.
	_ = append(a, chat.Tool{Name: "extra"})
	if again := researcher(classes); len(again) != 2 {
		t.Fatalf("Researcher tools after an append elsewhere: %d", len(again))
	}
}
