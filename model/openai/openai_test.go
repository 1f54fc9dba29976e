package openai

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/goleak"

	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/internal/replaytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newModel returns a Model talking to srv, with a fake clock.
func newModel(srv *replaytest.Server, clock clockwork.Clock) *Model {
	return New(Config{
		BaseURL:    srv.URL + "/v1",
		APIKey:     "sk-test",
		Model:      "gpt-test",
		HTTPClient: srv.Client(),
		Clock:      clock,
	})
}

func simpleRequest() *model.Request {
	return &model.Request{Messages: []model.Message{{Role: model.RoleUser, Content: []model.Content{model.Text("Hi")}}}}
}

// collect drains a stream.
func collect(seq func(func(model.Event, error) bool)) ([]model.Event, error) {
	var evs []model.Event
	for ev, err := range seq {
		if err != nil {
			return evs, err
		}
		evs = append(evs, ev)
	}
	return evs, nil
}

type result struct {
	events []model.Event
	err    error
}

// collectAsync drains a stream on another goroutine.
func collectAsync(ctx context.Context, m *Model, req *model.Request) <-chan result {
	done := make(chan result, 1)
	go func() {
		evs, err := collect(m.Stream(ctx, req))
		done <- result{evs, err}
	}()
	return done
}

func text(evs []model.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		if ev.Kind == model.EventTextDelta {
			b.WriteString(ev.Text)
		}
	}
	return b.String()
}

func TestText(t *testing.T) {
	srv := replaytest.New(t, replaytest.SSE(t, "testdata/text.sse"))
	evs, err := collect(newModel(srv, nil).Stream(t.Context(), simpleRequest()))
	if err != nil {
		t.Fatal(err)
	}
	want := []model.Event{
		{Kind: model.EventTextDelta, Text: "Hello"},
		{Kind: model.EventTextDelta, Text: "!"},
		{Kind: model.EventTextDelta, Text: " How can I"},
		{Kind: model.EventTextDelta, Text: " help you today?"},
		{Kind: model.EventFinish, FinishReason: model.FinishStop, Usage: model.Usage{InputTokens: 19, OutputTokens: 10}},
	}
	if !reflect.DeepEqual(evs, want) {
		t.Errorf("events:\n got %+v\nwant %+v", evs, want)
	}
	reqs := srv.Requests()
	if len(reqs) != 1 {
		t.Fatalf("got %d requests, want 1", len(reqs))
	}
	if reqs[0].Path != "/v1/chat/completions" {
		t.Errorf("path = %q", reqs[0].Path)
	}
	if got := reqs[0].Header.Get("Authorization"); got != "Bearer sk-test" {
		t.Errorf("Authorization = %q", got)
	}
}

func TestDebugBody(t *testing.T) {
	srv := replaytest.New(t, replaytest.SSE(t, "testdata/text.sse"))
	_, _ = collect(newModel(srv, nil).Stream(t.Context(), fullRequest()))
	t.Logf("%s", srv.Requests()[0].Body)
}

func fullRequest() *model.Request {
	return &model.Request{
		System:    "You are terse.",
		MaxTokens: 256,
		Messages: []model.Message{
			{Role: model.RoleUser, Content: []model.Content{model.Text("Weather and time in Paris?")}},
			{Role: model.RoleAssistant, Content: []model.Content{
				{Kind: model.ContentReasoning, Text: "Two tools."},
				model.Text("Let me check."),
				{Kind: model.ContentToolCall, ToolCallID: "call_1", ToolName: "get_weather", Input: json.RawMessage(`{"location":"Paris"}`)},
				{Kind: model.ContentToolCall, ToolCallID: "call_2", ToolName: "get_time", Input: json.RawMessage(`{"tz":"Europe/Paris"}`)},
			}},
			{Role: model.RoleTool, Content: []model.Content{
				{Kind: model.ContentToolResult, ToolCallID: "call_1", ToolName: "get_weather", Output: json.RawMessage(`{"temp_c":18}`)},
				{Kind: model.ContentToolResult, ToolCallID: "call_2", ToolName: "get_time", Output: json.RawMessage(`"unknown timezone"`), IsError: true},
			}},
			{Role: model.RoleUser, Content: []model.Content{model.Text("Thanks.")}},
		},
		Tools: []model.ToolSpec{{
			Name:        "get_weather",
			Description: "Current weather for a city.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"location":{"type":"string"}},"required":["location"],"additionalProperties":false}`),
		}, {
			Name:        "get_time",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"tz":{"type":"string"}}}`),
		}},
	}
}

var _ = errors.New
var _ = http.StatusOK
var _ = time.Second
