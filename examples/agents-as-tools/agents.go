// Package agentsastools is the agents-as-tools demo, shaped like the
// reference example of the same name so that its front end works against
// it: an Assistant chat agent hands research to Researcher children and
// planning to Planner children, in the foreground (the helper's timeline
// renders under the tool call), side by side (compare), or in the
// background (a detached run that reports progress and milestones and
// notifies the chat when it is done).
package agentsastools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
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
)

// Options configure the demo's classes.
type Options struct {
	// Models picks each class's model; nil means Offline(20 ms).
	Models *Models
	// SearchTime is how long the Researcher's simulated web search takes,
	// spread over its phases (searching, reading, synthesizing) so that
	// each one reaches the clients; zero means none.
	SearchTime time.Duration
	// Clock measures SearchTime; nil means the real clock.
	Clock clockwork.Clock
	// ExtraTools, when set, gives the Assistant more tools beside its
	// helpers, asked for at every turn: `agentry serve --mcp` passes the
	// tools of its MCP servers (mcpclient.Client.Tools).
	ExtraTools func() []chat.Tool
}

// Classes returns the demo's agent classes: Assistant, Researcher, Planner.
func Classes(o Options) []agent.Class {
	if o.Models == nil {
		o.Models = Offline(20*time.Millisecond, nil)
	}
	m := o.Models
	if o.Clock == nil {
		o.Clock = clockwork.NewRealClock()
	}
	search := searchPace{step: o.SearchTime / 3, clock: o.Clock}
	// A Researcher runs once per helper run, each a new instance: its
	// tools (their schemas inferred and resolved) are built once for the
	// class, not once per instance.
	researcherTools := sync.OnceValue(func() []chat.Tool { return newResearcherTools(search) })
	return []agent.Class{
		{Name: "Assistant", New: func() agent.Agent { return &Assistant{model: m.Assistant, extra: o.ExtraTools} },
			Callable: []string{"clearHelperRuns", "cancelBackground", "listHelperRuns", "inspectHelperRun"}, Public: true},
		// Researcher and Planner run only as the Assistant's helpers:
		// clients reach them as its sub-agents, through OnBeforeSubAgent.
		{Name: "Researcher", New: func() agent.Agent { return &Researcher{model: m.Researcher, tools: researcherTools} }},
		{Name: "Planner", New: func() agent.Agent { return &Planner{model: m.Planner} }},
	}
}

// Models are the demo's models, one per class.
type Models struct {
	Assistant, Researcher, Planner model.Model
}

// ResearchInput is the input of the research tools.
type ResearchInput struct {
	Query string `json:"query" jsonschema:"what to research, at least 3 characters"`
}

// PlanInput is the input of the plan tool.
type PlanInput struct {
	Description string `json:"description" jsonschema:"the change to plan, at least 5 characters"`
}

// CompareInput is the input of the compare tool.
type CompareInput struct {
	A string `json:"a" jsonschema:"the first thing to compare"`
	B string `json:"b" jsonschema:"the second thing to compare"`
	// C is an optional third thing ("compare A, B and C"): a fan-out of
	// three Researchers.
	C string `json:"c,omitempty" jsonschema:"an optional third thing to compare"`
}

func minLength(field string, n int) func(*jsonschema.Schema) {
	return func(s *jsonschema.Schema) { s.Properties[field].MinLength = &n }
}

// Assistant is the parent chat agent.
type Assistant struct {
	chat.Base
	model model.Model
	extra func() []chat.Tool

	toolsOnce sync.Once
	tools     []chat.Tool // the helpers, built once
}

// ChatModel returns the assistant's model.
func (a *Assistant) ChatModel() model.Model { return a.model }

// SystemPrompt tells the model about its helpers.
func (a *Assistant) SystemPrompt() string {
	return `You are a helpful assistant with helper agents. Use "research" to research one topic, ` +
		`"compare" to research two things side by side, "plan" to plan a code change, and ` +
		`"research_background" when the user does not want to wait. Answer briefly from the helpers' results.`
}

// MaxConcurrentAgentTools caps the helpers running at once.
func (a *Assistant) MaxConcurrentAgentTools() int { return 4 }

// Tools returns the assistant's helpers, and its extra tools (Options).
// The helpers are built on the first turn and kept: building a tool infers
// and resolves its input schema, which costs more than the turn's own work
// in a busy server (the model is offered them at every turn).
func (a *Assistant) Tools() []chat.Tool {
	a.toolsOnce.Do(func() { a.tools = a.helpers() })
	tools := slices.Clip(a.tools)
	if a.extra != nil {
		tools = append(tools, a.extra()...)
	}
	return tools
}

func (a *Assistant) helpers() []chat.Tool {
	return []chat.Tool{
		agenttool.AgentTool[ResearchInput]("Researcher", agenttool.ToolOptions{
			Name: "research", Description: "Research one topic in depth with a Researcher helper.",
			DisplayName: "Researcher", Icon: "🔎", Schema: minLength("query", 3)}),
		agenttool.AgentTool[PlanInput]("Planner", agenttool.ToolOptions{
			Name: "plan", Description: "Plan a code change with a Planner helper.",
			DisplayName: "Planner", Icon: "🗺️", Schema: minLength("description", 5)}),
		chat.NewTool("compare", "Research two (or three) things side by side, one Researcher helper each.", a.compare),
		chat.NewTool("research_background", "Research a topic in the background; the answer arrives later in the chat.", a.researchBackground).
			WithSchema(minLength("query", 3)),
		chat.NewTool("delete_helper_runs", "Delete every helper run and its child (asks the user first).", a.deleteHelperRuns).
			WithApproval(chat.RequireApproval).WithTitle("Delete helper runs"),
		chat.NewClientTool[struct{}]("get_local_time", "The user's local date, time and time zone, read on their device.").
			WithTitle("Local time"),
	}
}

// Deleted is what delete_helper_runs returns.
type Deleted struct {
	Deleted int `json:"deleted"`
}

// deleteHelperRuns deletes the helper runs, once the user approved it.
func (a *Assistant) deleteHelperRuns(ctx context.Context, _ struct{}) (Deleted, error) {
	n, err := agenttool.ClearAgentToolRuns(ctx, a, agenttool.ClearOptions{})
	return Deleted{Deleted: n}, err
}

// Settled is one side of a comparison.
type Settled struct {
	Status  agenttool.Status `json:"status"`
	Summary string           `json:"summary,omitempty"`
	Error   string           `json:"error,omitempty"`
}

// compare runs two Researchers (three when C is set) in parallel under the
// tool call and returns every result, whatever each one's outcome.
func (a *Assistant) compare(ctx context.Context, in CompareInput) (map[string]Settled, error) {
	tc, _ := chat.ToolCallFromContext(ctx)
	out := map[string]Settled{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sides := []struct{ key, query string }{{"a", in.A}, {"b", in.B}}
	if strings.TrimSpace(in.C) != "" {
		sides = append(sides, struct{ key, query string }{"c", in.C})
	}
	for i, side := range sides {
		wg.Add(1)
		go func() {
			defer wg.Done()
			opts := agenttool.RunOptions{Input: ResearchInput{Query: side.query}, ParentToolCallID: tc.ID, DisplayOrder: i,
				Display: agenttool.Display{"name": "Researcher", "icon": "🔎"}}
			if tc.ID != "" {
				opts.RunID = fmt.Sprintf("agent-tool:%s:%d", tc.ID, i)
			}
			res, err := agenttool.RunAgentTool(ctx, a, "Researcher", opts)
			s := Settled{Status: res.Status, Summary: res.Summary, Error: res.Error}
			if err != nil {
				s = Settled{Status: agenttool.StatusError, Error: err.Error()}
			}
			mu.Lock()
			out[side.key] = s
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out, nil
}

// Dispatched is what research_background returns to the model.
type Dispatched struct {
	Status string `json:"status"`
	RunID  string `json:"runId"`
	Note   string `json:"note"`
}

// NotifySource marks the chat messages of background runs.
const NotifySource = "agents-as-tools-background"

// researchBackground dispatches a detached Researcher.
func (a *Assistant) researchBackground(ctx context.Context, in ResearchInput) (Dispatched, error) {
	// The display name is the class's, like the foreground helpers': front
	// ends (the reference's among them) pick the drill-in by it. The
	// preview is the query itself, for people.
	opts := agenttool.RunOptions{Input: in, InputPreview: in.Query, Display: agenttool.Display{"name": "Researcher", "icon": "⏳"},
		Detached: &agenttool.DetachedOptions{
			Notify: true, NotifySource: NotifySource, MaxBudget: 5 * time.Minute,
			OnMilestones: &agenttool.MilestoneNotices{Names: []string{"sources-gathered"}, Mode: agenttool.MilestoneNarrate},
		}}
	if tc, ok := chat.ToolCallFromContext(ctx); ok && tc.ID != "" {
		opts.RunID = "agent-tool:" + tc.ID
	}
	res, err := agenttool.RunAgentTool(ctx, a, "Researcher", opts)
	if err != nil {
		return Dispatched{}, err
	}
	if res.Status == agenttool.StatusError {
		return Dispatched{}, errors.New(res.Error)
	}
	return Dispatched{Status: "dispatched", RunID: res.RunID,
		Note: "The research runs in the background; its result will arrive in this chat."}, nil
}

// FormatDetachedCompletion writes the chat message that tells the model a
// background run ended. It names the query, not the run id: the message is
// shown to people too.
func (a *Assistant) FormatDetachedCompletion(run agenttool.Run, res agenttool.Result) string {
	head := fmt.Sprintf("Background research on %q", previewQuery(run.InputPreview))
	switch res.Status {
	case agenttool.StatusCompleted:
		return head + " finished:\n\n" + res.Summary
	case agenttool.StatusAborted:
		return head + " was cancelled."
	default:
		msg := head + " stopped before it finished"
		if res.Error != "" {
			msg += ": " + res.Error
		}
		return msg + "."
	}
}

// FormatDetachedMilestone writes the chat line of a background run's
// milestone, without ids.
func (a *Assistant) FormatDetachedMilestone(run agenttool.Run, m agenttool.Milestone) string {
	q := previewQuery(run.InputPreview)
	if m.Name == "sources-gathered" {
		return fmt.Sprintf("The background research on %q has gathered its sources and is writing the summary.", q)
	}
	return fmt.Sprintf("The background research on %q reached %q.", q, m.Name)
}

// previewQuery reads the query from a run's input preview: a JSON string,
// itself either the query or the input's JSON.
func previewQuery(preview json.RawMessage) string {
	var s string
	if json.Unmarshal(preview, &s) != nil {
		s = string(preview)
	}
	var in ResearchInput
	if json.Unmarshal([]byte(s), &in) == nil && in.Query != "" {
		return in.Query
	}
	return s
}

// ClearHelperRuns deletes every helper run and its child.
func (a *Assistant) ClearHelperRuns(ctx context.Context) (int, error) {
	return agenttool.ClearAgentToolRuns(ctx, a, agenttool.ClearOptions{})
}

// CancelBackground cancels a helper run.
func (a *Assistant) CancelBackground(ctx context.Context, runID string) error {
	return agenttool.CancelAgentTool(ctx, a, runID, "cancelled by the user")
}

// ListHelperRuns returns the helper runs, for clients that show a list.
func (a *Assistant) ListHelperRuns(ctx context.Context) ([]agenttool.Run, error) {
	return agenttool.ListAgentToolRuns(ctx, a)
}

// HelperRunDetail is what inspectHelperRun returns: the registry row and
// the child's own record of the run (nil while the child does not know it).
type HelperRunDetail struct {
	Run        agenttool.Run         `json:"run"`
	Inspection *agenttool.Inspection `json:"inspection"`
}

// InspectHelperRun returns one helper run with the child's view of it:
// progress, milestones, summary or error.
func (a *Assistant) InspectHelperRun(ctx context.Context, runID string) (HelperRunDetail, error) {
	run, ok, err := agenttool.GetAgentToolRun(ctx, a, runID)
	if err != nil {
		return HelperRunDetail{}, err
	}
	if !ok {
		return HelperRunDetail{}, agent.Publicf("no helper run %q", runID)
	}
	insp, err := agenttool.InspectAgentToolRun(ctx, a, runID)
	if err != nil {
		return HelperRunDetail{}, fmt.Errorf("inspect helper run %q: %w", runID, err)
	}
	return HelperRunDetail{Run: run, Inspection: insp}, nil
}

// OnBeforeSubAgent lets clients drill into Researcher and Planner runs the
// registry holds, and nothing else.
func (a *Assistant) OnBeforeSubAgent(ctx context.Context, r *http.Request, class, name string) error {
	if class != "Researcher" && class != "Planner" {
		return &agent.HTTPError{Status: http.StatusNotFound, Message: "not found"}
	}
	ok, err := agenttool.HasAgentToolRun(ctx, a, class, name)
	if err != nil {
		return err
	}
	if !ok {
		return &agent.HTTPError{Status: http.StatusNotFound, Message: "not found"}
	}
	return nil
}

// Researcher researches one topic with a (simulated) web search.
type Researcher struct {
	chat.Base
	model model.Model
	tools func() []chat.Tool // the class's tools, built once (newResearcherTools)
}

// searchPace spaces the simulated search's phases: step apart on clock.
type searchPace struct {
	step  time.Duration
	clock clockwork.Clock
}

// wait waits one step, or until ctx ends.
func (p searchPace) wait(ctx context.Context) error {
	if p.step <= 0 {
		return ctx.Err()
	}
	select {
	case <-p.clock.After(p.step):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// FormatAgentToolInput makes the query the first message of the
// researcher's chat, as a person would have typed it.
func (r *Researcher) FormatAgentToolInput(input json.RawMessage, req agenttool.ChildRequest) message.Message {
	var in ResearchInput
	_ = json.Unmarshal(input, &in) // a bad input is shown as it came
	return inputMessage(input, req, in.Query)
}

// inputMessage is a run's first message: text, else the input as it came.
func inputMessage(input json.RawMessage, req agenttool.ChildRequest, text string) message.Message {
	if text == "" {
		text = string(input)
	}
	return message.Message{ID: "agent-tool-" + req.RunID + "-input", Role: message.RoleUser,
		Parts: []message.Part{{Type: message.PartText, Text: text}}}
}

// ChatModel returns the researcher's model.
func (r *Researcher) ChatModel() model.Model { return r.model }

// SystemPrompt tells the researcher what to do.
func (r *Researcher) SystemPrompt() string {
	return "Research the user's topic with web_search and end with a concise summary."
}

// SearchResult is one simulated search result.
type SearchResult struct {
	Title   string `json:"title"`
	URL     string `json:"url"`
	Snippet string `json:"snippet"`
}

// Tools returns web_search and publish_findings.
func (r *Researcher) Tools() []chat.Tool { return slices.Clip(r.tools()) }

// newResearcherTools builds the Researcher's tools, which every instance
// of the class shares: they keep no state of an instance.
func newResearcherTools(pace searchPace) []chat.Tool {
	return []chat.Tool{
		chat.NewTool("web_search", "Search the web (simulated).", func(ctx context.Context, in ResearchInput) ([]SearchResult, error) {
			return webSearch(ctx, pace, in)
		}).WithSchema(minLength("query", 1)),
		chat.NewTool("publish_findings", "Publish the findings to the team's wiki (asks the user first).", publishFindings).
			WithApproval(chat.RequireApproval).WithTitle("Publish findings"),
	}
}

// PublishInput is the input of publish_findings.
type PublishInput struct {
	Title string `json:"title" jsonschema:"the page title"`
}

// Published is what publish_findings returns.
type Published struct {
	URL string `json:"url"`
}

// publishFindings "publishes" the findings (simulated), once the user
// approved it.
func publishFindings(ctx context.Context, in PublishInput) (Published, error) {
	return Published{URL: "https://wiki.example.com/" + strings.ReplaceAll(strings.ToLower(in.Title), " ", "-")}, nil
}

func webSearch(ctx context.Context, pace searchPace, in ResearchInput) ([]SearchResult, error) {
	steps := []agenttool.Progress{
		{Fraction: agenttool.Fraction(0.2), Phase: "searching", Message: "Searching for " + in.Query},
		{Fraction: agenttool.Fraction(0.6), Phase: "reading", Message: "Reading 2 sources"},
	}
	for _, p := range steps {
		if err := agenttool.ReportProgress(ctx, p); err != nil {
			return nil, err
		}
		if err := pace.wait(ctx); err != nil {
			return nil, err
		}
	}
	if err := agenttool.ReportProgress(ctx, agenttool.Progress{Milestone: "sources-gathered",
		Data: map[string]any{"query": in.Query, "sources": 2}}); err != nil {
		return nil, err
	}
	if err := pace.wait(ctx); err != nil {
		return nil, err
	}
	if err := agenttool.ReportProgress(ctx, agenttool.Progress{Fraction: agenttool.Fraction(0.9), Phase: "synthesizing",
		Message: "Writing the summary"}); err != nil {
		return nil, err
	}
	slug := strings.ReplaceAll(strings.ToLower(in.Query), " ", "-")
	return []SearchResult{
		{Title: in.Query + ": an overview", URL: "https://example.com/" + slug, Snippet: "What " + in.Query + " is and why it matters."},
		{Title: in.Query + " in practice", URL: "https://example.org/" + slug, Snippet: "How teams use " + in.Query + " today."},
	}, nil
}

// Planner plans a code change by inspecting files.
type Planner struct {
	chat.Base
	model model.Model
}

// ChatModel returns the planner's model.
func (p *Planner) ChatModel() model.Model { return p.model }

// SystemPrompt tells the planner what to do.
func (p *Planner) SystemPrompt() string {
	return "Plan the change. Inspect the relevant files with inspect_file (1 to 3 times), then write a plan with " +
		"the sections Overview, Affected files, Step-by-step and Open questions."
}

// FormatAgentToolInput makes the description the first message of the
// planner's chat.
func (p *Planner) FormatAgentToolInput(input json.RawMessage, req agenttool.ChildRequest) message.Message {
	var in PlanInput
	_ = json.Unmarshal(input, &in) // a bad input is shown as it came
	return inputMessage(input, req, in.Description)
}

// FileInput is inspect_file's input.
type FileInput struct {
	Path string `json:"path" jsonschema:"the file to inspect"`
}

// FileInfo is inspect_file's (simulated) result.
type FileInfo struct {
	Path    string `json:"path"`
	Lines   int    `json:"lines"`
	Summary string `json:"summary"`
}

// Tools returns inspect_file.
func (p *Planner) Tools() []chat.Tool {
	return []chat.Tool{chat.NewTool("inspect_file", "Inspect a source file (simulated).",
		func(ctx context.Context, in FileInput) (FileInfo, error) {
			return FileInfo{Path: in.Path, Lines: 40 + 13*len(in.Path), Summary: "Defines the code that " + in.Path + " is named after."}, nil
		})}
}
