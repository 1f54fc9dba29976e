package chat_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/model/scripted"
)

type weatherIn struct {
	City string `json:"city"`
	Days int    `json:"days"`
}

type weatherOut struct {
	TempC int `json:"tempC"`
}

// toolModel calls tools according to the user's text and, once it sees tool
// results, answers with a summary of them.
func toolModel() *scripted.Model {
	call := func(word string, steps ...scripted.Step) scripted.Rule {
		return scripted.Rule{Name: word, Match: scripted.LastUserContains(word), Reply: scripted.Always(steps)}
	}
	return scripted.New(scripted.WithRules(
		scripted.ReportToolResults(),
		call("missing", scripted.ToolCall("weather", map[string]any{"days": 2})),
		call("wrongtype", scripted.ToolCall("weather", map[string]any{"city": 5, "days": 2})),
		call("nonjson", scripted.ToolCall("weather", json.RawMessage(`{"city": Paris`))),
		call("fails", scripted.ToolCall("failing", map[string]any{})),
		call("panics", scripted.ToolCall("panicky", map[string]any{})),
		call("unknown", scripted.ToolCall("nosuchtool", map[string]any{})),
		call("parallel", scripted.ToolCall("left", map[string]any{}), scripted.ToolCall("right", map[string]any{})),
		call("fine", scripted.ToolCall("weather", weatherIn{City: "Paris", Days: 1})),
	))
}

type toolCounts struct {
	weather, failing, panicky atomic.Int64
}

type empty struct{}

// barrier returns a tool function that blocks until n calls have started:
// it returns only if the calls run in parallel. Its wait is an await point
// (agent.Await), where the instance lets the other calls in.
func barrier(n int, started *atomic.Int64) func(ctx context.Context, in empty) (string, error) {
	var mu sync.Mutex
	arrived := 0
	all := make(chan struct{})
	return func(ctx context.Context, in empty) (string, error) {
		started.Add(1)
		mu.Lock()
		arrived++
		if arrived == n {
			close(all)
		}
		mu.Unlock()
		err := agent.Await(ctx, func() error {
			select {
			case <-all:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(waitLimit):
				return errors.New("the other call never started: tool calls do not run in parallel")
			}
		})
		if err != nil {
			return "", err
		}
		tc, _ := chat.ToolCallFromContext(ctx)
		return "met " + tc.Name, nil
	}
}

func toolRig(t *testing.T, m *scripted.Model, maxSteps int) (chatter, *toolCounts, *atomic.Int64) {
	t.Helper()
	counts := &toolCounts{}
	parallel := &atomic.Int64{}
	meet := barrier(2, parallel)
	k := &kit{model: m, maxSteps: maxSteps, tools: []chat.Tool{
		chat.NewTool("weather", "Weather in a city.", func(ctx context.Context, in weatherIn) (weatherOut, error) {
			counts.weather.Add(1)
			return weatherOut{TempC: 21}, nil
		}),
		chat.NewTool("failing", "Always fails.", func(ctx context.Context, in empty) (string, error) {
			counts.failing.Add(1)
			return "", errors.New("backend down")
		}),
		chat.NewTool("panicky", "Always panics.", func(ctx context.Context, in empty) (string, error) {
			counts.panicky.Add(1)
			panic("kaboom")
		}),
		chat.NewTool("left", "Meets right.", meet),
		chat.NewTool("right", "Meets left.", meet),
	}}
	r := newRig(t, rigOptions{classes: []agent.Class{chatClass("ToolBot", k)}})
	return getChat(t, r.rt, "ToolBot", "tools"), counts, parallel
}

// TestToolErrorsContinueTheTurn: invalid input (a missing required field, a
// wrong type, input that is not JSON), a tool that returns an error, a tool
// that panics and an unknown tool each give a tool part in output-error
// with the reason; the turn goes on: the model is called again with the
// error as the tool result and its final text ends the message.
func TestToolErrorsContinueTheTurn(t *testing.T) {
	cases := []struct {
		ask, tool string
		wantErr   []string // substrings of the part's error text
		executed  func(*toolCounts) int64
	}{
		{ask: "missing", tool: "weather", wantErr: []string{"invalid tool input", "city"},
			executed: func(c *toolCounts) int64 { return c.weather.Load() }},
		{ask: "wrongtype", tool: "weather", wantErr: []string{"invalid tool input", "city"},
			executed: func(c *toolCounts) int64 { return c.weather.Load() }},
		{ask: "nonjson", tool: "weather", wantErr: []string{"not valid JSON"},
			executed: func(c *toolCounts) int64 { return c.weather.Load() }},
		{ask: "fails", tool: "failing", wantErr: []string{"backend down"},
			executed: func(c *toolCounts) int64 { return c.failing.Load() - 1 }},
		{ask: "panics", tool: "panicky", wantErr: []string{"panicked", "kaboom"},
			executed: func(c *toolCounts) int64 { return c.panicky.Load() - 1 }},
		{ask: "unknown", tool: "nosuchtool", wantErr: []string{"unknown tool", "nosuchtool"},
			executed: func(c *toolCounts) int64 { return 0 }},
	}
	for _, tc := range cases {
		t.Run(tc.ask, func(t *testing.T) {
			m := toolModel()
			a, counts, _ := toolRig(t, m, 0)
			res, err := a.SaveMessages(testCtx(t), []message.Message{userMsg("please " + tc.ask)})
			if err != nil {
				t.Fatal(err)
			}
			if res.Outcome != chat.OutcomeCompleted {
				t.Fatalf("outcome %s (%s), want completed", res.Outcome, res.Error)
			}
			if n := tc.executed(counts); n != 0 {
				t.Fatalf("tool function ran %d times more than it should", n)
			}
			parts := toolParts(res.Message)
			if len(parts) != 1 {
				t.Fatalf("tool parts %+v, want one", parts)
			}
			p := parts[0]
			if p.ToolName() != tc.tool || p.State != message.StateOutputError {
				t.Fatalf("tool part %s in state %s, want %s in output-error", p.ToolName(), p.State, tc.tool)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(p.ErrorText, w) {
					t.Fatalf("error text %q lacks %q", p.ErrorText, w)
				}
			}
			calls := m.Calls()
			if len(calls) != 2 {
				t.Fatalf("%d model calls, want 2 (the model sees the error and answers)", len(calls))
			}
			results := scripted.ToolResults(calls[1].Request)
			if len(results) != 1 || !results[0].IsError || !strings.Contains(string(results[0].Output), tc.wantErr[0]) {
				t.Fatalf("second model call's tool results %+v, want the error", results)
			}
			text := res.Text()
			if !strings.HasPrefix(text, "after: ["+tc.tool+" error=true") {
				t.Fatalf("final text %q, want the model's answer to the error", text)
			}
			last := res.Message.Parts[len(res.Message.Parts)-1]
			if last.Type != message.PartText || last.Text != text {
				t.Fatalf("the message does not end with the final text: %+v", res.Message.Parts)
			}
		})
	}
}

// TestToolSuccess: a valid call runs the tool once and its output reaches
// the model.
func TestToolSuccess(t *testing.T) {
	m := toolModel()
	a, counts, _ := toolRig(t, m, 0)
	res, err := a.SaveMessages(testCtx(t), []message.Message{userMsg("all fine?")})
	if err != nil || res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("%+v, %v", res, err)
	}
	if counts.weather.Load() != 1 {
		t.Fatalf("weather ran %d times", counts.weather.Load())
	}
	parts := toolParts(res.Message)
	if len(parts) != 1 || parts[0].State != message.StateOutputAvailable || string(parts[0].Output) != `{"tempC":21}` {
		t.Fatalf("tool parts %+v", parts)
	}
	if got := res.Text(); got != `after: [weather error=false {"tempC":21}]` {
		t.Fatalf("text %q", got)
	}
}

// TestToolCallsRunInParallel: two calls in one step each block until both
// have started, which returns only if they run at the same time.
func TestToolCallsRunInParallel(t *testing.T) {
	m := toolModel()
	a, _, started := toolRig(t, m, 0)
	res, err := a.SaveMessages(testCtx(t), []message.Message{userMsg("in parallel please")})
	if err != nil || res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("%+v, %v", res, err)
	}
	if started.Load() != 2 {
		t.Fatalf("%d calls started, want 2", started.Load())
	}
	parts := toolParts(res.Message)
	if len(parts) != 2 {
		t.Fatalf("tool parts %+v, want 2", parts)
	}
	for _, p := range parts {
		if p.State != message.StateOutputAvailable || string(p.Output) != `"met `+p.ToolName()+`"` {
			t.Fatalf("part %s: state %s output %s error %q", p.ToolName(), p.State, p.Output, p.ErrorText)
		}
	}
	if n := len(m.Calls()); n != 2 {
		t.Fatalf("%d model calls, want 2", n)
	}
	if n := len(scripted.ToolResults(m.Calls()[1].Request)); n != 2 {
		t.Fatalf("second model call saw %d tool results, want 2", n)
	}
}

// TestStepLimit: a model that always calls a tool is stopped after
// MaxSteps model calls; the turn ends.
func TestStepLimit(t *testing.T) {
	m := scripted.New(scripted.WithDefault(scripted.Always(scripted.Reply{
		scripted.ToolCall("weather", weatherIn{City: "Oslo", Days: 1}),
	})))
	a, counts, _ := toolRig(t, m, 3)
	res, err := a.SaveMessages(testCtx(t), []message.Message{userMsg("loop forever")})
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("outcome %s (%s)", res.Outcome, res.Error)
	}
	if n := len(m.Calls()); n != 3 {
		t.Fatalf("%d model calls, want 3 (MaxSteps)", n)
	}
	if n := counts.weather.Load(); n != 3 {
		t.Fatalf("tool ran %d times, want 3", n)
	}
	steps := 0
	for _, p := range res.Message.Parts {
		if p.Type == message.PartStepStart {
			steps++
		}
	}
	if steps != 3 || len(toolParts(res.Message)) != 3 {
		t.Fatalf("message has %d steps and %d tool parts, want 3 and 3", steps, len(toolParts(res.Message)))
	}
}
