package agenttool_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
)

// Group A (FL): the failure envelope and the tool factory.

// TestFailureOf covers scenarios 1–3: interrupted is the only retryable
// failure and carries its cause; aborted and error are final; defaults fill
// an empty error text.
func TestFailureOf(t *testing.T) {
	still := true
	cases := []struct {
		name string
		in   agenttool.Result
		want string
	}{
		{"interrupted", agenttool.Result{Status: agenttool.StatusInterrupted, Error: "child reset by deploy", Reason: agenttool.ReasonNoProgress, ChildStillRunning: &still},
			`{"ok":false,"status":"interrupted","error":"child reset by deploy","retryable":true,"reason":"no-progress","childStillRunning":true}`},
		{"interrupted without cause", agenttool.Result{Status: agenttool.StatusInterrupted},
			`{"ok":false,"status":"interrupted","error":"agent tool run was interrupted before it finished; it can be retried","retryable":true}`},
		{"aborted", agenttool.Result{Status: agenttool.StatusAborted, Error: "stop"},
			`{"ok":false,"status":"aborted","error":"stop","retryable":false}`},
		{"aborted default", agenttool.Result{Status: agenttool.StatusAborted},
			`{"ok":false,"status":"aborted","error":"agent tool run was cancelled","retryable":false}`},
		{"error", agenttool.Result{Status: agenttool.StatusError, Error: "boom"},
			`{"ok":false,"status":"error","error":"boom","retryable":false}`},
		{"error default", agenttool.Result{Status: agenttool.StatusError},
			`{"ok":false,"status":"error","error":"agent tool run failed","retryable":false}`},
		// A reason on a non-interrupted result never leaks into the envelope.
		{"error ignores reason", agenttool.Result{Status: agenttool.StatusError, Error: "x", Reason: agenttool.ReasonNoProgress, ChildStillRunning: &still},
			`{"ok":false,"status":"error","error":"x","retryable":false}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, _ := json.Marshal(agenttool.FailureOf(c.in))
			if string(got) != c.want {
				t.Fatalf("FailureOf = %s\nwant %s", got, c.want)
			}
		})
	}
}

// callingModel calls tool with input, then answers "Done".
func callingModel(tool string, input any) *scripted.Model {
	return scripted.New(
		scripted.WithRules(scripted.Rule{Match: scripted.LastIsToolResult, Reply: scripted.Always(scripted.Reply{scripted.Text("Done")})}),
		scripted.WithDefault(scripted.Always(scripted.Reply{scripted.ToolCall(tool, input)})))
}

// runToolTurn runs one parent turn that calls tool, and returns the tool
// part of the answer.
func runToolTurn(t *testing.T, a *assistant, tool string) message.Part {
	t.Helper()
	res, err := a.SaveMessages(testCtx(t), []message.Message{userMsg("go")})
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("parent turn %s: %s", res.Outcome, res.Error)
	}
	for _, p := range res.Message.Parts {
		if p.Type == "tool-"+tool {
			return p
		}
	}
	t.Fatalf("no tool-%s part in %+v", tool, res.Message.Parts)
	return message.Part{}
}

// TestAgentToolReturnsSummary covers scenarios 4 and 7: a completed run
// without an output type gives the model the summary string; the run id is
// "agent-tool:<toolCallId>" and the run renders under that tool call, with
// the tool's display metadata.
func TestAgentToolReturnsSummary(t *testing.T) {
	k := newKit()
	k.parentModel = callingModel("research", researchInput{Query: "cats"})
	k.parentTools = []chat.Tool{agenttool.AgentTool[researchInput]("Researcher", agenttool.ToolOptions{
		Name: "research", Description: "Research one topic in depth.", DisplayName: "Researcher", Icon: "search"})}
	env := startKit(t, k, agenttool.Options{})
	a := getAssistant(t, env, "a4")
	part := runToolTurn(t, a, "research")
	if part.State != message.StateOutputAvailable || string(part.Output) != `"Findings for cats"` {
		t.Fatalf("tool part = %+v output %s", part, part.Output)
	}
	if part.Title != "Researcher" {
		t.Errorf("tool title = %q, want the display name", part.Title)
	}
	run := getRun(t, a, "agent-tool:"+part.ToolCallID)
	if run.ParentToolCallID != part.ToolCallID || run.AgentType != "Researcher" || run.Status != agenttool.StatusCompleted ||
		run.Summary != "Findings for cats" || run.DisplayOrder != 0 {
		t.Fatalf("run = %+v", run)
	}
	jsonEq(t, run.Display, map[string]any{"icon": "search", "name": "Researcher"})
	// The default preview of an object input is its JSON text.
	if string(run.InputPreview) != `"{\"query\":\"cats\"}"` {
		t.Errorf("input preview = %s", run.InputPreview)
	}
}

// TestAgentToolWithOutput covers scenario 5 with the seed's Extractor: the
// child stores its result in its own table, ends its turn without text,
// and the model gets the structured output (summary from the summary hook).
func TestAgentToolWithOutput(t *testing.T) {
	k := newKit()
	k.extractor = extractorModel("Ada", "Alan")
	k.parentModel = callingModel("extract", researchInput{Query: "people"})
	k.parentTools = []chat.Tool{agenttool.AgentToolWithOutput[researchInput, extraction]("Extractor", agenttool.ToolOptions{Name: "extract"})}
	env := startKit(t, k, agenttool.Options{})
	a := getAssistant(t, env, "a5")
	part := runToolTurn(t, a, "extract")
	if part.State != message.StateOutputAvailable {
		t.Fatalf("tool part = %+v", part)
	}
	jsonEq(t, part.Output, extraction{Entities: []string{"Ada", "Alan"}, Count: 2})
	run := getRun(t, a, "agent-tool:"+part.ToolCallID)
	if run.Summary != "Extraction complete" {
		t.Errorf("summary = %q", run.Summary)
	}
	jsonEq(t, run.Output, extraction{Entities: []string{"Ada", "Alan"}, Count: 2})
}

// wrongShape does not match the Extractor's output: count is a string.
type wrongShape struct {
	Count string `json:"count"`
}

// TestAgentToolOutputSchemaMismatch covers scenario 6: output that fails
// the output type's schema is a tool error (not a failure envelope).
func TestAgentToolOutputSchemaMismatch(t *testing.T) {
	k := newKit()
	k.extractor = extractorModel("Ada")
	k.parentModel = callingModel("extract", researchInput{Query: "people"})
	k.parentTools = []chat.Tool{agenttool.AgentToolWithOutput[researchInput, wrongShape]("Extractor", agenttool.ToolOptions{Name: "extract"})}
	env := startKit(t, k, agenttool.Options{})
	a := getAssistant(t, env, "a6")
	part := runToolTurn(t, a, "extract")
	if part.State != message.StateOutputError || !strings.Contains(part.ErrorText, "does not match its schema") {
		t.Fatalf("tool part = %+v", part)
	}
	// The run itself completed; only the tool call failed.
	if run := getRun(t, a, "agent-tool:"+part.ToolCallID); run.Status != agenttool.StatusCompleted {
		t.Fatalf("run = %+v", run)
	}
}

// TestAgentToolMissingOutput: a child that completes without structured
// output, where the tool requires it, gives the model an error envelope.
func TestAgentToolMissingOutput(t *testing.T) {
	k := newKit()
	k.parentModel = callingModel("research", researchInput{Query: "cats"})
	k.parentTools = []chat.Tool{agenttool.AgentToolWithOutput[researchInput, extraction]("Researcher", agenttool.ToolOptions{Name: "research"})}
	env := startKit(t, k, agenttool.Options{})
	a := getAssistant(t, env, "a-missing")
	part := runToolTurn(t, a, "research")
	if part.State != message.StateOutputAvailable {
		t.Fatalf("tool part = %+v", part)
	}
	jsonEq(t, part.Output, agenttool.Failure{Status: agenttool.StatusError,
		Error: "agent tool completed without structured output required by outputSchema"})
}

// TestAgentToolFailureEnvelope: a child whose stream fails gives the
// model {ok:false,status:"error",retryable:false} with the child's error,
// sanitized.
func TestAgentToolFailureEnvelope(t *testing.T) {
	k := newKit()
	k.researcher = scripted.New(scripted.WithDefault(scripted.Always(scripted.Reply{scripted.Text("partial"), scripted.Fail(errors.New("model stream failed"))})))
	k.parentModel = callingModel("research", researchInput{Query: "cats"})
	k.parentTools = []chat.Tool{agenttool.AgentTool[researchInput]("Researcher", agenttool.ToolOptions{Name: "research"})}
	env := startKit(t, k, agenttool.Options{})
	a := getAssistant(t, env, "a-fail")
	part := runToolTurn(t, a, "research")
	var f agenttool.Failure
	if err := json.Unmarshal(part.Output, &f); err != nil {
		t.Fatalf("output %s: %v", part.Output, err)
	}
	if f.OK || f.Status != agenttool.StatusError || f.Retryable {
		t.Fatalf("failure = %+v", f)
	}
	// The model's error is internal: the parent's model and clients see
	// its id, the log its text.
	k.logs.InternalError(t, f.Error, "model stream failed", "agent=Assistant/a-fail/Researcher/")
}

// TestAgentToolCapRefusedEnvelope: a tool call refused by the concurrency
// cap is an error envelope for the model, and leaves no row.
func TestAgentToolCapRefusedEnvelope(t *testing.T) {
	k := newKit()
	k.cap = 1
	k.parentModel = callingModel("research", researchInput{Query: "cats"})
	k.parentTools = []chat.Tool{agenttool.AgentTool[researchInput]("Researcher", agenttool.ToolOptions{Name: "research"})}
	env := startKit(t, k, agenttool.Options{})
	a := getAssistant(t, env, "a-cap")
	seed(t, env, a, seedRow{RunID: "busy", AgentType: "Researcher", Status: "running", StartedAt: env.RT.Clock().Now()})
	part := runToolTurn(t, a, "research")
	jsonEq(t, part.Output, agenttool.Failure{Status: agenttool.StatusError, Error: "maxConcurrentAgentTools (1) exceeded"})
	if _, ok, _ := agenttool.GetAgentToolRun(testCtx(t), a, "agent-tool:"+part.ToolCallID); ok {
		t.Fatal("a refused dispatch left a row")
	}
}

// TestSummarizerFormatsItsInput: the seed's Summarizer, a custom-handler
// child, formats its own input message; used through an AgentTool.
func TestSummarizerFormatsItsInput(t *testing.T) {
	k := newKit()
	k.summarizer = scripted.New(scripted.WithDefault(func(req *model.Request) scripted.Reply {
		return scripted.Reply{scripted.Text("Short: " + strings.Fields(strings.TrimPrefix(scripted.LastUserText(req), "Summarize:\n\n"))[0])}
	}))
	k.parentModel = callingModel("summarize", summarizeInput{Text: "Gophers dig tunnels all day long."})
	k.parentTools = []chat.Tool{agenttool.AgentTool[summarizeInput]("Summarizer", agenttool.ToolOptions{
		Name: "summarize", Description: "Summarize long text in a separate retained agent."})}
	env := startKit(t, k, agenttool.Options{})
	a := getAssistant(t, env, "a-sum")
	part := runToolTurn(t, a, "summarize")
	if string(part.Output) != `"Short: Gophers"` {
		t.Fatalf("tool output = %s", part.Output)
	}
	runID := "agent-tool:" + part.ToolCallID
	child := childOf[*summarizer](t, env, a, "Summarizer", runID)
	msgs := child.Messages()
	if len(msgs) != 2 || msgs[0].ID != "agent-tool-"+runID+"-input" || msgs[0].Parts[0].Text != "Summarize:\n\nGophers dig tunnels all day long." ||
		msgs[1].Role != message.RoleAssistant || chat.MessageText(msgs[1]) != "Short: Gophers" {
		t.Fatalf("child transcript = %+v", msgs)
	}
}
