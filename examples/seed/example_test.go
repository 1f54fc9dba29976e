package seed_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/examples/seed"
	"github.com/agentry/agentry/store/sqlite"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// start runs the seed's classes on a runtime with an embedded database in
// a temporary folder, as `agentry serve` would.
func start() (*agent.Runtime, func()) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "seed-example")
	if err != nil {
		log.Fatal(err)
	}
	db, err := sqlite.Open(ctx, filepath.Join(dir, "agentry.db"))
	if err != nil {
		log.Fatal(err)
	}
	rt, err := agent.New(ctx, agent.Options{DB: db, IdleTimeout: -1})
	if err != nil {
		log.Fatal(err)
	}
	for _, c := range seed.Classes(seed.Options{}) {
		rt.MustRegister(c)
	}
	chat.Configure(rt, chat.Config{})
	agenttool.Install(rt, agenttool.Options{})
	if err := rt.Start(ctx); err != nil {
		log.Fatal(err)
	}
	return rt, func() {
		rt.Close()
		db.Close()
		os.RemoveAll(dir)
	}
}

func ask(text string) []message.Message {
	return []message.Message{{Role: message.RoleUser, Parts: []message.Part{{Type: message.PartText, Text: text}}}}
}

// The Assistant's model calls the research tool; the Researcher runs as a
// retained child and its summary is the tool's result.
func Example_agentTool() {
	rt, stop := start()
	defer stop()
	ctx := context.Background()
	a, _ := rt.Get(ctx, agent.Root("Assistant", "user-1"))
	assistant := a.(*seed.Assistant)

	turn, err := assistant.SaveMessages(ctx, ask("HTTP/3"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(turn.Text())

	runs, _ := agenttool.ListAgentToolRuns(ctx, assistant)
	for _, r := range runs {
		fmt.Println(r.RunID, r.AgentType, r.Status, r.Display["name"])
	}
	// The child is a real agent with its own transcript.
	child, _ := agent.SubAgent[*seed.Researcher](ctx, assistant, "Researcher", runs[0].RunID)
	for _, m := range child.Messages() {
		fmt.Printf("%s: %s\n", m.Role, chat.MessageText(m))
	}
	// Output:
	// Here is what I found: "Findings on HTTP/3: it is well documented."
	// agent-tool:call_1_0 Researcher completed Researcher
	// user: {
	//   "query": "HTTP/3"
	// }
	// assistant: Findings on HTTP/3: it is well documented.
}

// The AIChatAgent variant: a custom-handler Summarizer formats its own
// input message.
func Example_summarizer() {
	rt, stop := start()
	defer stop()
	ctx := context.Background()
	a, _ := rt.Get(ctx, agent.Root("SummaryAssistant", "user-1"))
	assistant := a.(*seed.SummaryAssistant)

	turn, err := assistant.SaveMessages(ctx, ask("Gophers dig tunnels. They live underground and eat roots."))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(turn.Text())

	runs, _ := agenttool.ListAgentToolRuns(ctx, assistant)
	child, _ := agent.SubAgent[*seed.Summarizer](ctx, assistant, "Summarizer", runs[0].RunID)
	input := child.Messages()[0]
	fmt.Printf("%s %q\n", input.ID, chat.MessageText(input))
	// Output:
	// In short: Gophers dig tunnels.
	// agent-tool-agent-tool:call_1_0-input "Summarize:\n\nGophers dig tunnels. They live underground and eat roots."
}

// A workflow child: the Extractor stores its result in its own table and
// writes no text; the output and summary hooks make the run's result.
func Example_extractor() {
	rt, stop := start()
	defer stop()
	ctx := context.Background()
	a, _ := rt.Get(ctx, agent.Root("Assistant", "user-1"))

	res, err := agenttool.RunAgentTool(ctx, a, "Extractor", agenttool.RunOptions{
		Input: "Ada Lovelace worked with Charles Babbage in London.",
		RunID: "extract-1",
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Status, res.Summary)
	fmt.Println(string(res.Output))
	// Output:
	// completed Extraction complete
	// {"entities":["Ada","Lovelace","Charles","Babbage","London"]}
}

// Two runs in parallel under one tool call, with settled results in
// display order (the seed's Promise.allSettled example).
func Example_parallel() {
	rt, stop := start()
	defer stop()
	ctx := context.Background()
	a, _ := rt.Get(ctx, agent.Root("Assistant", "user-1"))

	cmp, err := a.(*seed.Assistant).Compare(ctx, "call_compare", "HTTP/3", "gRPC")
	if err != nil {
		log.Fatal(err)
	}
	for i, r := range cmp.Results {
		fmt.Println(i, r.Status, r.Summary, cmp.Errors[i] == "")
	}
	runs, _ := agenttool.ListAgentToolRuns(ctx, a)
	orders := map[int]string{}
	for _, r := range runs {
		orders[r.DisplayOrder] = r.ParentToolCallID
	}
	fmt.Println(len(runs), orders[0], orders[1])
	// Output:
	// 0 completed Findings on HTTP/3: it is well documented. true
	// 1 completed Findings on gRPC: it is well documented. true
	// 2 call_compare call_compare
}

// Retained runs are deleted explicitly, children included.
func Example_clear() {
	rt, stop := start()
	defer stop()
	ctx := context.Background()
	a, _ := rt.Get(ctx, agent.Root("Assistant", "user-1"))
	if _, err := agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{Input: "QUIC", RunID: "r1"}); err != nil {
		log.Fatal(err)
	}
	n, _ := agenttool.ClearAgentToolRuns(ctx, a, agenttool.ClearOptions{
		Status: []agenttool.Status{agenttool.StatusCompleted, agenttool.StatusError, agenttool.StatusAborted, agenttool.StatusInterrupted},
	})
	exists, _ := rt.Exists(ctx, agent.Root("Assistant", "user-1").Child("Researcher", "r1"))
	fmt.Println(n, exists)
	// Output:
	// 1 false
}

// TestResearchQueryTooShort: the research tool's input schema requires at
// least 3 characters (z.string().min(3)); the model gets a tool error and
// no child is started.
func TestResearchQueryTooShort(t *testing.T) {
	rt, stop := start()
	defer stop()
	ctx := context.Background()
	a, _ := rt.Get(ctx, agent.Root("Assistant", "short"))
	turn, err := a.(*seed.Assistant).SaveMessages(ctx, ask("Go"))
	if err != nil {
		t.Fatal(err)
	}
	var part message.Part
	for _, p := range turn.Message.Parts {
		if p.Type == "tool-research" {
			part = p
		}
	}
	if part.State != message.StateOutputError {
		t.Fatalf("tool part = %+v", part)
	}
	if runs, _ := agenttool.ListAgentToolRuns(ctx, a); len(runs) != 0 {
		t.Fatalf("runs = %+v", runs)
	}
}
