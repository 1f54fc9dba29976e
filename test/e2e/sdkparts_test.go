package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/anthropic"
	"github.com/agentry/agentry/model/openai"
	"github.com/agentry/agentry/model/scripted"
)

// sdkChat is a declarative chat agent with a given model and tools.
type sdkChat struct {
	chat.Base
	m     model.Model
	tools []chat.Tool
}

func (a *sdkChat) ChatModel() model.Model { return a.m }
func (a *sdkChat) Tools() []chat.Tool     { return a.tools }

// requests keeps the bodies of the requests a fake provider received.
type requests struct {
	mu     sync.Mutex
	bodies []string
}

func (q *requests) record(r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	q.mu.Lock()
	q.bodies = append(q.bodies, string(b))
	q.mu.Unlock()
}

// fakeOpenAI is a local OpenAI-compatible server that answers every chat
// completion with "A single dot." and keeps the request bodies.
type fakeOpenAI struct{ requests }

func (f *fakeOpenAI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.record(r)
	w.Header().Set("Content-Type", "text/event-stream")
	for _, ev := range []string{
		`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-test","choices":[{"index":0,"delta":{"role":"assistant","content":"A single dot."},"finish_reason":null}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-test","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":11,"completion_tokens":3,"total_tokens":14}}`,
		`[DONE]`,
	} {
		fmt.Fprintf(w, "data: %s\n\n", ev)
	}
}

// fakeAnthropic is a local Anthropic Messages server that answers every
// request with "A PDF." and keeps the request bodies.
type fakeAnthropic struct{ requests }

func (f *fakeAnthropic) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.record(r)
	w.Header().Set("Content-Type", "text/event-stream")
	for _, ev := range [][2]string{
		{"message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[],"stop_reason":null,"usage":{"input_tokens":25,"output_tokens":1}}}`},
		{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`},
		{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"A PDF."}}`},
		{"content_block_stop", `{"type":"content_block_stop","index":0}`},
		{"message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":4}}`},
		{"message_stop", `{"type":"message_stop"}`},
	} {
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev[0], ev[1])
	}
}

// TestSDKParts runs test/npm/sdk-parts.mjs: regenerate with the real
// client; file parts from sendMessage({files}) that reach the model
// through the real OpenAI SDK (an image) and the real Anthropic SDK (a
// PDF) against local servers (this test checks the request bodies); a
// tool's data parts, transient data and preliminary output; and the
// assistant message's metadata and usage.
func TestSDKParts(t *testing.T) {
	var answers atomic.Int64
	count := scripted.New(scripted.WithDefault(func(req *model.Request) scripted.Reply {
		return scripted.Reply{scripted.Text(fmt.Sprintf("answer %d to %s", answers.Add(1), scripted.LastUserText(req)))}
	}))
	fake := &fakeOpenAI{}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	gpt := openai.New(openai.Config{BaseURL: srv.URL + "/v1", APIKey: "sk-test", Model: "gpt-test", HTTPClient: srv.Client(), MaxRetries: -1})
	fakeA := &fakeAnthropic{}
	srvA := httptest.NewServer(fakeA)
	defer srvA.Close()
	claude := anthropic.New(anthropic.Config{BaseURL: srvA.URL, APIKey: "sk-test", Model: "claude-test", HTTPClient: srvA.Client(), MaxRetries: -1})
	report := chat.NewTool("report", "Report progress.", func(ctx context.Context, in struct{}) (map[string]bool, error) {
		s, _ := chat.ToolStreamFrom(ctx)
		for _, err := range []error{
			s.Data("status", "s1", map[string]int{"n": 1}),
			s.Transient("ping", "", map[string]int{"x": 1}),
			s.Data("status", "s1", map[string]int{"n": 2}),
			s.Preliminary(map[string]bool{"partial": true}),
		} {
			if err != nil {
				return nil, err
			}
		}
		return map[string]bool{"done": true}, nil
	})
	parts := scripted.New(scripted.WithRules(
		scripted.Rule{Name: "after", Match: scripted.LastIsToolResult, Reply: scripted.Always(scripted.Reply{scripted.Text("reported")})},
		scripted.Rule{Name: "call", Match: scripted.LastUserContains("report"), Reply: scripted.Always(scripted.Reply{scripted.ToolCall("report", map[string]any{})})},
	))
	class := func(name string, m model.Model, tools ...chat.Tool) agent.Class {
		return agent.Class{Name: name, Public: true, New: func() agent.Agent { return &sdkChat{m: m, tools: tools} }}
	}
	env := testenv.Start(t, testenv.Options{
		Classes: []agent.Class{class("CountChat", count), class("FileChat", gpt), class("ClaudeChat", claude), class("PartsChat", parts, report)},
		Setup:   func(rt *agent.Runtime) error { chat.Configure(rt, chat.Config{}); return nil },
	})
	runScript(t, 60*time.Second, "PASS sdk-parts", "sdk-parts.mjs", env.Host)
	fake.mu.Lock()
	defer fake.mu.Unlock()
	const png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
	if len(fake.bodies) != 1 || !strings.Contains(fake.bodies[0], `{"image_url":{"url":"data:image/png;base64,`+png+`"},"type":"image_url"}`) ||
		!strings.Contains(fake.bodies[0], `"text":"what is in the picture?"`) {
		t.Fatalf("OpenAI request bodies: %q", fake.bodies)
	}
	fakeA.mu.Lock()
	defer fakeA.mu.Unlock()
	const pdf = "JVBERi0xLjQKJSVFT0YK" // "%PDF-1.4\n%%EOF\n"
	if len(fakeA.bodies) != 1 || !strings.Contains(fakeA.bodies[0], `{"source":{"data":"`+pdf+`","media_type":"application/pdf","type":"base64"},"title":"doc.pdf","type":"document"}`) {
		t.Fatalf("Anthropic request bodies: %q", fakeA.bodies)
	}
}
