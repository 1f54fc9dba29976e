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
	sdk "github.com/openai/openai-go/v3"
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
		"model": "gpt-test",
		"stream": true,
		"stream_options": {"include_usage": true},
		"max_completion_tokens": 256,
		"messages": [
			{"role": "system", "content": "You are terse."},
			{"role": "user", "content": "Weather and time in Paris?"},
			{"role": "assistant", "content": "Let me check.", "tool_calls": [
				{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"location\":\"Paris\"}"}},
				{"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{\"tz\":\"Europe/Paris\"}"}}
			]},
			{"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\":18}"},
			{"role": "tool", "tool_call_id": "call_2", "content": "unknown timezone"},
			{"role": "user", "content": "Thanks."}
		],
		"tools": [
			{"type": "function", "function": {
				"name": "get_weather",
				"description": "Current weather for a city.",
				"parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"], "additionalProperties": false}
			}},
			{"type": "function", "function": {
				"name": "get_time",
				"parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}
			}}
		]
	}`, &want)
	if !reflect.DeepEqual(got, want) {
		g, _ := json.MarshalIndent(got, "", "  ")
		w, _ := json.MarshalIndent(want, "", "  ")
		t.Errorf("request body:\n got %s\nwant %s", g, w)
	}
}

func TestParallelToolCalls(t *testing.T) {
	srv := replaytest.New(t, replaytest.SSE(t, "testdata/tool_calls.sse"))
	evs, err := collect(newModel(srv, nil).Stream(t.Context(), simpleRequest()))
	if err != nil {
		t.Fatal(err)
	}
	const (
		id1 = "call_QxXrLhVFRVvd4bUpDKS1Mk4g"
		id2 = "call_8nMvKwJZt2mS0fTqYc3bRd1e"
	)
	want := []model.Event{
		{Kind: model.EventToolCallStart, ToolCallID: id1, ToolName: "get_weather"},
		{Kind: model.EventToolCallDelta, ToolCallID: id1, InputDelta: `{"lo`},
		{Kind: model.EventToolCallDelta, ToolCallID: id1, InputDelta: `cation": "P`},
		{Kind: model.EventToolCallDelta, ToolCallID: id1, InputDelta: `aris"}`},
		{Kind: model.EventToolCallStart, ToolCallID: id2, ToolName: "get_time"},
		{Kind: model.EventToolCallDelta, ToolCallID: id2, InputDelta: `{"tz": `},
		{Kind: model.EventToolCallDelta, ToolCallID: id2, InputDelta: `"Europe/Paris"}`},
		{Kind: model.EventToolCall, ToolCallID: id1, ToolName: "get_weather", Input: json.RawMessage(`{"location": "Paris"}`)},
		{Kind: model.EventToolCall, ToolCallID: id2, ToolName: "get_time", Input: json.RawMessage(`{"tz": "Europe/Paris"}`)},
		{Kind: model.EventFinish, FinishReason: model.FinishToolCalls, Usage: model.Usage{InputTokens: 82, OutputTokens: 48}},
	}
	if !reflect.DeepEqual(evs, want) {
		t.Errorf("events:\n got %+v\nwant %+v", evs, want)
	}
}

func TestReasoningFromCompatibleServer(t *testing.T) {
	srv := replaytest.New(t, replaytest.SSE(t, "testdata/reasoning.sse"))
	evs, err := collect(newModel(srv, nil).Stream(t.Context(), simpleRequest()))
	if err != nil {
		t.Fatal(err)
	}
	want := []model.Event{
		{Kind: model.EventReasoningDelta, Text: "The user"},
		{Kind: model.EventReasoningDelta, Text: " asks 2+2."},
		{Kind: model.EventTextDelta, Text: "4"},
		{Kind: model.EventFinish, FinishReason: model.FinishLength, Usage: model.Usage{InputTokens: 9, OutputTokens: 7}},
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

func TestServerErrorRetriedWithBackoff(t *testing.T) {
	srv := replaytest.New(t,
		replaytest.JSON(t, http.StatusInternalServerError, nil, "testdata/server_error.json"),
		replaytest.JSON(t, http.StatusServiceUnavailable, nil, "testdata/server_error.json"),
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

func TestRetriesExhausted(t *testing.T) {
	srv := replaytest.New(t,
		replaytest.JSON(t, http.StatusInternalServerError, nil, "testdata/server_error.json"),
		replaytest.JSON(t, http.StatusInternalServerError, nil, "testdata/server_error.json"),
	)
	m := New(Config{BaseURL: srv.URL + "/v1", APIKey: "k", HTTPClient: srv.Client(), MaxRetries: 1, Clock: clockwork.NewFakeClock()})
	clock := m.clock.(*clockwork.FakeClock)
	done := collectAsync(t.Context(), m, simpleRequest())
	if err := clock.BlockUntilContext(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(500 * time.Millisecond)
	r := <-done
	var aerr *sdk.Error
	if !errors.As(r.Err, &aerr) || aerr.StatusCode != http.StatusInternalServerError {
		t.Fatalf("err = %v, want a 500 API error", r.Err)
	}
	if !strings.HasPrefix(r.Err.Error(), "openai: stream: ") {
		t.Errorf("err = %q, want it prefixed with context", r.Err)
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
	if aerr.Code != "string_above_max_length" {
		t.Errorf("code = %q", aerr.Code)
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
	if err == nil || !strings.HasPrefix(err.Error(), "openai: stream: ") || !strings.Contains(err.Error(), "server_error") {
		t.Errorf("err = %v, want the stream's server_error", err)
	}
	if n := len(srv.Requests()); n != 1 {
		t.Errorf("got %d requests, want 1 (no retry after events)", n)
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

func TestInvalidSchema(t *testing.T) {
	m := New(Config{BaseURL: "http://127.0.0.1:1/v1", APIKey: "k"})
	req := simpleRequest()
	req.Tools = []model.ToolSpec{{Name: "bad", InputSchema: json.RawMessage(`[`)}}
	_, err := collect(m.Stream(t.Context(), req))
	if err == nil || !strings.HasPrefix(err.Error(), "openai: request: tool \"bad\"") {
		t.Errorf("err = %v", err)
	}
}

func TestFinishReason(t *testing.T) {
	for _, tc := range []struct {
		in    string
		calls bool
		want  string
	}{
		{"stop", false, model.FinishStop},
		{"length", false, model.FinishLength},
		{"tool_calls", true, model.FinishToolCalls},
		{"function_call", true, model.FinishToolCalls},
		{"content_filter", false, model.FinishContentFilter},
		{"", true, model.FinishToolCalls},
		{"", false, model.FinishOther},
		{"weird", false, model.FinishOther},
	} {
		if got := finishReason(tc.in, tc.calls); got != tc.want {
			t.Errorf("finishReason(%q, %v) = %q, want %q", tc.in, tc.calls, got, tc.want)
		}
	}
}

func TestConfigFromEnv(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "sk-env")
	t.Setenv("OPENAI_BASE_URL", "http://localhost:11434/v1")
	t.Setenv("AGENTRY_MODEL", "")
	got := ConfigFromEnv()
	want := Config{APIKey: "sk-env", BaseURL: "http://localhost:11434/v1", Model: DefaultModel}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ConfigFromEnv() = %+v, want %+v", got, want)
	}
	t.Setenv("AGENTRY_MODEL", "llama3.2")
	if got := ConfigFromEnv().Model; got != "llama3.2" {
		t.Errorf("Model = %q", got)
	}
}

func mustUnmarshal(t *testing.T, s string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(s), v); err != nil {
		t.Fatal(err)
	}
}
