package anthropic

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/jonboulle/clockwork"
	"go.uber.org/goleak"

	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/internal/replaytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newModel returns a Model talking to srv, with a fake clock.
func newModel(srv *replaytest.Server, clock clockwork.Clock) *Model {
	return New(Config{
		BaseURL:    srv.URL,
		APIKey:     "sk-test",
		Model:      "claude-test",
		HTTPClient: srv.Client(),
		Clock:      clock,
	})
}

func simpleRequest() *model.Request { return replaytest.UserRequest("Hi") }

var (
	collect = replaytest.Collect
	text    = replaytest.Text
)

func collectAsync(ctx context.Context, m *Model, req *model.Request) <-chan replaytest.Result {
	return replaytest.CollectAsync(ctx, m, req)
}

func TestText(t *testing.T) {
	srv := replaytest.New(t, replaytest.SSE(t, "testdata/text.sse"))
	evs, err := collect(newModel(srv, nil).Stream(t.Context(), simpleRequest()))
	if err != nil {
		t.Fatal(err)
	}
	want := []model.Event{
		{Kind: model.EventTextDelta, Text: "Hello"},
		{Kind: model.EventTextDelta, Text: "! How can I"},
		{Kind: model.EventTextDelta, Text: " help you today?"},
		{Kind: model.EventFinish, FinishReason: model.FinishStop, Usage: model.Usage{InputTokens: 25, OutputTokens: 12}},
	}
	if !reflect.DeepEqual(evs, want) {
		t.Errorf("events:\n got %+v\nwant %+v", evs, want)
	}
	reqs := srv.Requests()
	if len(reqs) != 1 {
		t.Fatalf("got %d requests, want 1", len(reqs))
	}
	if reqs[0].Path != "/v1/messages" {
		t.Errorf("path = %q", reqs[0].Path)
	}
	if got := reqs[0].Header.Get("X-Api-Key") + reqs[0].Header.Get("Authorization"); !strings.Contains(got, "sk-test") {
		t.Errorf("the API key was not sent: %v", reqs[0].Header)
	}
	if reqs[0].Header.Get("Anthropic-Version") == "" {
		t.Error("no Anthropic-Version header")
	}
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

func TestRequestBody(t *testing.T) {
	srv := replaytest.New(t, replaytest.SSE(t, "testdata/text.sse"))
	if _, err := collect(newModel(srv, nil).Stream(t.Context(), fullRequest())); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(srv.Requests()[0].Body, &got); err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	mustUnmarshal(t, `{
		"model": "claude-test",
		"stream": true,
		"max_tokens": 256,
		"system": [{"type": "text", "text": "You are terse."}],
		"messages": [
			{"role": "user", "content": [{"type": "text", "text": "Weather and time in Paris?"}]},
			{"role": "assistant", "content": [
				{"type": "text", "text": "Let me check."},
				{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"location": "Paris"}},
				{"type": "tool_use", "id": "call_2", "name": "get_time", "input": {"tz": "Europe/Paris"}}
			]},
			{"role": "user", "content": [
				{"type": "tool_result", "tool_use_id": "call_1", "is_error": false, "content": [{"type": "text", "text": "{\"temp_c\":18}"}]},
				{"type": "tool_result", "tool_use_id": "call_2", "is_error": true, "content": [{"type": "text", "text": "unknown timezone"}]},
				{"type": "text", "text": "Thanks."}
			]}
		],
		"tools": [
			{
				"name": "get_weather",
				"description": "Current weather for a city.",
				"input_schema": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"], "additionalProperties": false}
			},
			{
				"name": "get_time",
				"input_schema": {"type": "object", "properties": {"tz": {"type": "string"}}}
			}
		]
	}`, &want)
	if !reflect.DeepEqual(got, want) {
		g, _ := json.MarshalIndent(got, "", "  ")
		w, _ := json.MarshalIndent(want, "", "  ")
		t.Errorf("request body:\n got %s\nwant %s", g, w)
	}
}

func TestDefaultsInRequest(t *testing.T) {
	srv := replaytest.New(t, replaytest.SSE(t, "testdata/text.sse"))
	m := New(Config{BaseURL: srv.URL, APIKey: "k", HTTPClient: srv.Client(), ThinkingBudget: 1024})
	if _, err := collect(m.Stream(t.Context(), simpleRequest())); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Model     string `json:"model"`
		MaxTokens int    `json:"max_tokens"`
		Thinking  struct {
			Type         string `json:"type"`
			BudgetTokens int    `json:"budget_tokens"`
		} `json:"thinking"`
	}
	if err := json.Unmarshal(srv.Requests()[0].Body, &got); err != nil {
		t.Fatal(err)
	}
	if got.Model != DefaultModel || got.MaxTokens != DefaultMaxTokens || got.Thinking.Type != "enabled" || got.Thinking.BudgetTokens != 1024 {
		t.Errorf("request = %+v", got)
	}
}

func TestParallelToolUse(t *testing.T) {
	srv := replaytest.New(t, replaytest.SSE(t, "testdata/tool_use.sse"))
	evs, err := collect(newModel(srv, nil).Stream(t.Context(), simpleRequest()))
	if err != nil {
		t.Fatal(err)
	}
	const (
		id1 = "toolu_01T1x1fJ34qAmk2tNTrN7Up6"
		id2 = "toolu_01VAtrv4a3U4jyLc1pZpQz8h"
		id3 = "toolu_01NoArgs9kQm2cVbXr7sLw4E"
	)
	want := []model.Event{
		{Kind: model.EventReasoningDelta, Text: "Two independent lookups;"},
		{Kind: model.EventReasoningDelta, Text: " call both tools."},
		{Kind: model.EventTextDelta, Text: "Let me check both."},
		{Kind: model.EventToolCallStart, ToolCallID: id1, ToolName: "get_weather"},
		{Kind: model.EventToolCallDelta, ToolCallID: id1, InputDelta: `{"location":`},
		{Kind: model.EventToolCallDelta, ToolCallID: id1, InputDelta: ` "Paris"}`},
		{Kind: model.EventToolCall, ToolCallID: id1, ToolName: "get_weather", Input: json.RawMessage(`{"location": "Paris"}`)},
		{Kind: model.EventToolCallStart, ToolCallID: id2, ToolName: "get_time"},
		{Kind: model.EventToolCallDelta, ToolCallID: id2, InputDelta: `{"tz": "Eu`},
		{Kind: model.EventToolCallDelta, ToolCallID: id2, InputDelta: `rope/Paris"}`},
		{Kind: model.EventToolCall, ToolCallID: id2, ToolName: "get_time", Input: json.RawMessage(`{"tz": "Europe/Paris"}`)},
		{Kind: model.EventToolCallStart, ToolCallID: id3, ToolName: "list_cities"},
		{Kind: model.EventToolCall, ToolCallID: id3, ToolName: "list_cities", Input: json.RawMessage(`{}`)},
		{Kind: model.EventFinish, FinishReason: model.FinishToolCalls, Usage: model.Usage{InputTokens: 572, OutputTokens: 89}},
	}
	if !reflect.DeepEqual(evs, want) {
		t.Errorf("events:\n got %+v\nwant %+v", evs, want)
	}
}

func TestRateLimitRetriedAfterRetryAfter(t *testing.T) {
	srv := replaytest.New(t,
		replaytest.JSON(t, http.StatusTooManyRequests, http.Header{"Retry-After": {"3"}}, "testdata/rate_limit.json"),
		replaytest.SSE(t, "testdata/text.sse"),
	)
	clock := clockwork.NewFakeClock()
	done := collectAsync(t.Context(), newModel(srv, clock), simpleRequest())

	if err := clock.BlockUntilContext(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	if n := len(srv.Requests()); n != 1 {
		t.Fatalf("got %d requests before the backoff, want 1", n)
	}
	clock.Advance(3*time.Second - time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("stream ended before Retry-After elapsed: %v", r.Err)
	default:
	}
	clock.Advance(time.Millisecond)
	r := <-done
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if got := text(r.Events); got != "Hello! How can I help you today?" {
		t.Errorf("text = %q", got)
	}
	if n := len(srv.Requests()); n != 2 {
		t.Errorf("got %d requests, want 2", n)
	}
}

func TestRetryAfterCapped(t *testing.T) {
	srv := replaytest.New(t,
		replaytest.JSON(t, http.StatusTooManyRequests, http.Header{"Retry-After": {"86400"}}, "testdata/rate_limit.json"),
		replaytest.SSE(t, "testdata/text.sse"),
	)
	clock := clockwork.NewFakeClock()
	done := collectAsync(t.Context(), newModel(srv, clock), simpleRequest())
	if err := clock.BlockUntilContext(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	if r := <-done; r.Err != nil {
		t.Fatal(r.Err)
	}
}

func TestServerErrorRetriedWithBackoff(t *testing.T) {
	srv := replaytest.New(t,
		replaytest.JSON(t, http.StatusInternalServerError, nil, "testdata/server_error.json"),
		replaytest.JSON(t, 529, nil, "testdata/overloaded.json"),
		replaytest.SSE(t, "testdata/text.sse"),
	)
	clock := clockwork.NewFakeClock()
	done := collectAsync(t.Context(), newModel(srv, clock), simpleRequest())

	// Exponential backoff: 500ms, then 1s.
	for i, d := range []time.Duration{500 * time.Millisecond, time.Second} {
		if err := clock.BlockUntilContext(t.Context(), 1); err != nil {
			t.Fatal(err)
		}
		if n := len(srv.Requests()); n != i+1 {
			t.Fatalf("got %d requests before backoff %d, want %d", n, i, i+1)
		}
		clock.Advance(d)
	}
	r := <-done
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if got := text(r.Events); got != "Hello! How can I help you today?" {
		t.Errorf("text = %q", got)
	}
	if n := len(srv.Requests()); n != 3 {
		t.Errorf("got %d requests, want 3", n)
	}
}

func TestOverloadedBeforeFirstEventRetried(t *testing.T) {
	srv := replaytest.New(t, replaytest.SSE(t, "testdata/overloaded_early.sse"), replaytest.SSE(t, "testdata/text.sse"))
	clock := clockwork.NewFakeClock()
	done := collectAsync(t.Context(), newModel(srv, clock), simpleRequest())
	if err := clock.BlockUntilContext(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(500 * time.Millisecond)
	r := <-done
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if got := text(r.Events); got != "Hello! How can I help you today?" {
		t.Errorf("text = %q", got)
	}
}

func TestConnectionErrorRetried(t *testing.T) {
	srv := replaytest.New(t, replaytest.Response{Hangup: true}, replaytest.SSE(t, "testdata/text.sse"))
	clock := clockwork.NewFakeClock()
	done := collectAsync(t.Context(), newModel(srv, clock), simpleRequest())
	if err := clock.BlockUntilContext(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(500 * time.Millisecond)
	r := <-done
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if n := len(srv.Requests()); n != 2 {
		t.Errorf("got %d requests, want 2", n)
	}
}

func TestBadRequestNotRetried(t *testing.T) {
	srv := replaytest.New(t, replaytest.JSON(t, http.StatusBadRequest, nil, "testdata/bad_request.json"))
	evs, err := collect(newModel(srv, clockwork.NewFakeClock()).Stream(t.Context(), simpleRequest()))
	var aerr *sdk.Error
	if !errors.As(err, &aerr) || aerr.StatusCode != http.StatusBadRequest {
		t.Fatalf("err = %v, want a 400 API error", err)
	}
	if !strings.HasPrefix(err.Error(), "anthropic: stream: ") {
		t.Errorf("err = %q, want it prefixed with context", err)
	}
	if len(evs) != 0 || len(srv.Requests()) != 1 {
		t.Errorf("got %d events and %d requests, want 0 and 1", len(evs), len(srv.Requests()))
	}
}

func TestMidStreamError(t *testing.T) {
	srv := replaytest.New(t, replaytest.SSE(t, "testdata/midstream_error.sse"), replaytest.SSE(t, "testdata/text.sse"))
	evs, err := collect(newModel(srv, clockwork.NewFakeClock()).Stream(t.Context(), simpleRequest()))
	want := []model.Event{
		{Kind: model.EventTextDelta, Text: "Once upon"},
		{Kind: model.EventTextDelta, Text: " a time"},
	}
	if !reflect.DeepEqual(evs, want) {
		t.Errorf("events:\n got %+v\nwant %+v", evs, want)
	}
	var aerr *sdk.Error
	if !errors.As(err, &aerr) || aerr.Type() != "overloaded_error" {
		t.Errorf("err = %v, want the stream's overloaded_error", err)
	}
	if err == nil || !strings.HasPrefix(err.Error(), "anthropic: stream: ") {
		t.Errorf("err = %v, want it prefixed with context", err)
	}
	if n := len(srv.Requests()); n != 1 {
		t.Errorf("got %d requests, want 1 (no retry after events)", n)
	}
}

func TestTruncatedStream(t *testing.T) {
	srv := replaytest.New(t, replaytest.SSE(t, "testdata/truncated.sse"))
	evs, err := collect(newModel(srv, clockwork.NewFakeClock()).Stream(t.Context(), simpleRequest()))
	if len(evs) != 1 || evs[0].Text != "Hel" {
		t.Errorf("events = %+v", evs)
	}
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("err = %v, want io.ErrUnexpectedEOF", err)
	}
}

func TestBreakStopsStream(t *testing.T) {
	srv := replaytest.New(t, replaytest.SSE(t, "testdata/text.sse"))
	var got []model.Event
	for ev, err := range newModel(srv, nil).Stream(t.Context(), simpleRequest()) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev)
		break
	}
	if len(got) != 1 || got[0].Text != "Hello" {
		t.Errorf("events = %+v", got)
	}
}

func TestCanceledDuringBackoff(t *testing.T) {
	srv := replaytest.New(t, replaytest.JSON(t, http.StatusTooManyRequests, nil, "testdata/rate_limit.json"))
	clock := clockwork.NewFakeClock()
	ctx, cancel := context.WithCancel(t.Context())
	done := collectAsync(ctx, newModel(srv, clock), simpleRequest())
	if err := clock.BlockUntilContext(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	cancel()
	r := <-done
	if !errors.Is(r.Err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", r.Err)
	}
}

func TestFinishReason(t *testing.T) {
	for in, want := range map[string]string{
		"end_turn":                      model.FinishStop,
		"stop_sequence":                 model.FinishStop,
		"max_tokens":                    model.FinishLength,
		"model_context_window_exceeded": model.FinishLength,
		"tool_use":                      model.FinishToolCalls,
		"refusal":                       model.FinishContentFilter,
		"pause_turn":                    model.FinishOther,
		"":                              model.FinishOther,
	} {
		if got := finishReason(in); got != want {
			t.Errorf("finishReason(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestConfigFromEnv(t *testing.T) {
	t.Setenv("ANTHROPIC_API_KEY", "sk-ant-env")
	t.Setenv("ANTHROPIC_BASE_URL", "https://proxy.example/anthropic")
	t.Setenv("AGENTRY_MODEL", "")
	got := ConfigFromEnv()
	want := Config{APIKey: "sk-ant-env", BaseURL: "https://proxy.example/anthropic", Model: DefaultModel}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ConfigFromEnv() = %+v, want %+v", got, want)
	}
}

func mustUnmarshal(t *testing.T, s string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(s), v); err != nil {
		t.Fatal(err)
	}
}
