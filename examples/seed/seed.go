// Package seed is the "Agents as tools" page in Go: every code example of
// the seed (an Assistant with a Researcher agent tool, an Assistant with a
// custom-handler Summarizer, the workflow Extractor with its own table and
// its output and summary hooks, and two runs in parallel under one tool
// call) as agent classes on scripted models, so that they run offline and
// deterministically. example_test.go runs them; test/e2e drives them with
// the real npm clients.
package seed

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
)

// Options configure the classes' scripted models.
type Options struct {
	// Delay between streamed chunks; zero means none.
	Delay time.Duration
	// Clock drives the delay; nil means the real clock.
	Clock clockwork.Clock
}

func (o Options) model(opts ...scripted.Option) model.Model {
	if o.Delay > 0 {
		opts = append(opts, scripted.WithDelay(o.Delay))
	}
	if o.Clock != nil {
		opts = append(opts, scripted.WithClock(o.Clock))
	}
	return scripted.New(opts...)
}

// Classes returns the seed's classes: Assistant, Researcher,
// SummaryAssistant, Summarizer and Extractor.
func Classes(o Options) []agent.Class {
	researcher := ResearcherModel(o)
	assistant := AssistantModel(o)
	summarizer := SummarizerModel(o)
	summaryAssistant := SummaryAssistantModel(o)
	extractor := ExtractorModel(o)
	return []agent.Class{
		{Name: "Assistant", New: func() agent.Agent { return &Assistant{model: assistant} }, Callable: []string{"compare"}, Public: true},
		{Name: "Researcher", New: func() agent.Agent { return &Researcher{model: researcher} }},
		{Name: "SummaryAssistant", New: func() agent.Agent { return &SummaryAssistant{model: summaryAssistant} }, Public: true},
		{Name: "Summarizer", New: func() agent.Agent { return &Summarizer{model: summarizer} }},
		{Name: "Extractor", New: func() agent.Agent { return &Extractor{model: extractor} }},
	}
}

// ---------------------------------------------------------------------------
// "Use an agent as an AI SDK tool": Researcher and Assistant.

// Researcher researches one topic (the seed's Think child).
type Researcher struct {
	chat.Base
	model model.Model
}

// SystemPrompt is the seed's getSystemPrompt.
func (r *Researcher) SystemPrompt() string {
	return "Research the user's topic and end with a concise summary."
}

// ChatModel returns the scripted model.
func (r *Researcher) ChatModel() model.Model { return r.model }

// ResearchInput is the research tool's input.
type ResearchInput struct {
	Query string `json:"query"`
}

// Assistant gives its model the Researcher as a tool (the seed's
// getTools), and can fan out to two Researchers itself (Compare).
type Assistant struct {
	chat.Base
	model model.Model
}

// ChatModel returns the scripted model.
func (a *Assistant) ChatModel() model.Model { return a.model }

// Tools is the seed's getTools: research = agentTool(Researcher, …).
func (a *Assistant) Tools() []chat.Tool {
	return []chat.Tool{
		agenttool.AgentTool[ResearchInput]("Researcher", agenttool.ToolOptions{
			Name:        "research",
			Description: "Research one topic in depth.",
			DisplayName: "Researcher",
			Schema:      func(s *jsonschema.Schema) { s.Properties["query"].MinLength = ptr(3) }, // z.string().min(3)
		}),
	}
}

// OnBeforeSubAgent is the seed's drill-in gate: a Researcher is reachable
// through the Assistant's route only if the registry holds its run, so a
// guessed run id creates nothing. (Agentry applies this rule to agent-tool
// children by default; the hook is where an application changes it.)
func (a *Assistant) OnBeforeSubAgent(ctx context.Context, r *http.Request, className, name string) error {
	ok, err := agenttool.HasAgentToolRun(ctx, a, className, name)
	if err != nil {
		return err
	}
	if !ok {
		return &agent.HTTPError{Status: http.StatusNotFound, Message: "Not found"}
	}
	return nil
}

// ---------------------------------------------------------------------------
// "Run an agent tool imperatively": two Researchers in parallel.

// Comparison is what Compare returns: the tool call the runs render under
// and both settled results, in display order.
type Comparison struct {
	ToolCallID string             `json:"toolCallId"`
	Results    []agenttool.Result `json:"results"`
	Errors     []string           `json:"errors"`
}

// Compare researches two topics in parallel under one tool call, with
// display orders 0 and 1 (the seed's Promise.allSettled example). It is
// callable over RPC as "compare".
func (a *Assistant) Compare(ctx context.Context, toolCallID, left, right string) (Comparison, error) {
	c := Comparison{ToolCallID: toolCallID, Results: make([]agenttool.Result, 2), Errors: make([]string, 2)}
	var wg sync.WaitGroup
	for i, query := range []string{left, right} {
		wg.Go(func() {
			res, err := agenttool.RunAgentTool(ctx, a, "Researcher", agenttool.RunOptions{
				Input:            ResearchInput{Query: query},
				ParentToolCallID: toolCallID,
				DisplayOrder:     i,
			})
			c.Results[i] = res
			if err != nil { // allSettled: a rejected run does not hide the other
				c.Errors[i] = err.Error()
			}
		})
	}
	wg.Wait()
	return c, nil
}

// ---------------------------------------------------------------------------
// The AIChatAgent variant: a custom-handler Summarizer.

// SummarizeInput is the summarize tool's input.
type SummarizeInput struct {
	Text string `json:"text"`
}

// Summarizer writes its turns itself and formats its agent-tool input.
type Summarizer struct {
	chat.Base
	model model.Model
}

// FormatAgentToolInput is the seed's formatAgentToolInput.
func (s *Summarizer) FormatAgentToolInput(input json.RawMessage, req agenttool.ChildRequest) message.Message {
	var in SummarizeInput
	_ = json.Unmarshal(input, &in)
	return message.Message{
		ID:    "agent-tool-" + req.RunID + "-input",
		Role:  message.RoleUser,
		Parts: []message.Part{{Type: message.PartText, Text: "Summarize:\n\n" + in.Text}},
	}
}

// OnChatMessage is the seed's onChatMessage: stream the model's answer to
// the transcript.
func (s *Summarizer) OnChatMessage(ctx context.Context, t *chat.Turn) error {
	return t.RunLoop(ctx, chat.LoopOptions{Model: s.model})
}

// SummaryAssistant writes its turns itself and offers its model the
// Summarizer as a tool, with at most 5 steps.
type SummaryAssistant struct {
	chat.Base
	model model.Model
}

// OnChatMessage runs the model with the summarize tool.
func (a *SummaryAssistant) OnChatMessage(ctx context.Context, t *chat.Turn) error {
	return t.RunLoop(ctx, chat.LoopOptions{
		Model: a.model,
		Tools: []chat.Tool{
			agenttool.AgentTool[SummarizeInput]("Summarizer", agenttool.ToolOptions{
				Name:        "summarize",
				Description: "Summarize long text in a separate retained agent.",
			}),
		},
		MaxSteps: 5, // stopWhen: stepCountIs(5)
	})
}

// ---------------------------------------------------------------------------
// A workflow child with structured output: the Extractor.

// Extraction is the Extractor's structured output.
type Extraction struct {
	Entities []string `json:"entities"`
}

// Extractor finds entities and stores its result in its own table before
// its turn ends; its turn writes no text.
type Extractor struct {
	chat.Base
	model model.Model
}

// OnStart creates the Extractor's table.
func (e *Extractor) OnStart(ctx context.Context) error {
	return e.Storage().Update(ctx, func(s *agent.SQL) error {
		_, err := s.Exec(`CREATE TABLE IF NOT EXISTS {extraction_runs} (id TEXT PRIMARY KEY, result_json TEXT NOT NULL)`)
		return err
	})
}

// ChatModel returns the scripted model.
func (e *Extractor) ChatModel() model.Model { return e.model }

// Tools gives the model the tool that stores the result. The instance is
// named by the run id, so the row's id is the run id.
func (e *Extractor) Tools() []chat.Tool {
	return []chat.Tool{chat.NewTool("save_extraction", "Store the extracted entities.",
		func(ctx context.Context, in Extraction) (string, error) {
			data, err := json.Marshal(in)
			if err != nil {
				return "", err
			}
			err = e.Storage().Update(ctx, func(s *agent.SQL) error {
				_, err := s.Exec(`INSERT INTO {extraction_runs} (id, result_json) VALUES (?, ?)`, e.Name(), string(data))
				return err
			})
			return "saved", err
		})}
}

// AgentToolOutput is the seed's getAgentToolOutput.
func (e *Extractor) AgentToolOutput(ctx context.Context, runID string) (any, error) {
	var raw string
	err := e.Storage().View(ctx, func(s *agent.SQL) error {
		return s.QueryRow(`SELECT result_json FROM {extraction_runs} WHERE id = ?`, runID).Scan(&raw)
	})
	if err != nil {
		if strings.Contains(err.Error(), "no rows") {
			return nil, nil // undefined
		}
		return nil, err
	}
	return json.RawMessage(raw), nil
}

// AgentToolSummary is the seed's getAgentToolSummary.
func (e *Extractor) AgentToolSummary(ctx context.Context, runID string, output json.RawMessage) string {
	if len(output) > 0 {
		return "Extraction complete"
	}
	return ""
}

// ---------------------------------------------------------------------------
// Scripted models.

// ResearcherModel answers "Findings on <query>: …" to a {"query":…} input.
func ResearcherModel(o Options) model.Model {
	return o.model(scripted.WithDefault(func(req *model.Request) scripted.Reply {
		var in ResearchInput
		if err := json.Unmarshal([]byte(scripted.LastUserText(req)), &in); err != nil || in.Query == "" {
			in.Query = scripted.LastUserText(req)
		}
		return scripted.Reply{scripted.Text(fmt.Sprintf("Findings on %s: it is well documented.", in.Query))}
	}))
}

// AssistantModel calls research with the user's text, then answers with the
// tool's result.
func AssistantModel(o Options) model.Model {
	return o.model(
		scripted.WithRules(scripted.Rule{Match: scripted.LastIsToolResult, Reply: func(req *model.Request) scripted.Reply {
			return scripted.Reply{scripted.Text("Here is what I found: " + string(scripted.ToolResults(req)[0].Output))}
		}}),
		scripted.WithDefault(func(req *model.Request) scripted.Reply {
			return scripted.Reply{scripted.ToolCall("research", ResearchInput{Query: scripted.LastUserText(req)})}
		}))
}

// SummarizerModel answers with the first sentence of the text to
// summarize.
func SummarizerModel(o Options) model.Model {
	return o.model(scripted.WithDefault(func(req *model.Request) scripted.Reply {
		text := strings.TrimPrefix(scripted.LastUserText(req), "Summarize:\n\n")
		first, _, _ := strings.Cut(text, ".")
		return scripted.Reply{scripted.Text("In short: " + first + ".")}
	}))
}

// SummaryAssistantModel calls summarize with the user's text, then relays
// the summary.
func SummaryAssistantModel(o Options) model.Model {
	return o.model(
		scripted.WithRules(scripted.Rule{Match: scripted.LastIsToolResult, Reply: func(req *model.Request) scripted.Reply {
			var summary string
			_ = json.Unmarshal(scripted.ToolResults(req)[0].Output, &summary)
			return scripted.Reply{scripted.Text(summary)}
		}}),
		scripted.WithDefault(func(req *model.Request) scripted.Reply {
			return scripted.Reply{scripted.ToolCall("summarize", SummarizeInput{Text: scripted.LastUserText(req)})}
		}))
}

// ExtractorModel stores the capitalized words of the input as entities,
// then ends its turn without text.
func ExtractorModel(o Options) model.Model {
	return o.model(
		scripted.WithRules(scripted.Rule{Match: scripted.LastIsToolResult, Reply: scripted.Always(scripted.Reply{})}),
		scripted.WithDefault(func(req *model.Request) scripted.Reply {
			var text string
			if err := json.Unmarshal([]byte(scripted.LastUserText(req)), &text); err != nil {
				text = scripted.LastUserText(req)
			}
			var ents []string
			for _, w := range strings.Fields(text) {
				w = strings.Trim(w, ".,;:!?\"")
				if w != "" && w[0] >= 'A' && w[0] <= 'Z' {
					ents = append(ents, w)
				}
			}
			return scripted.Reply{scripted.ToolCall("save_extraction", Extraction{Entities: ents})}
		}))
}

func ptr[T any](v T) *T { return &v }
