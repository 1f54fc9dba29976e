package chat_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"iter"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/openai"
	"github.com/agentry/agentry/model/scripted"
)

// reportTool writes to its turn's stream: a persisted data part twice
// with the same id (the second replaces the first), transient data, and a
// preliminary output before its final one. It keeps its stream, so the
// test can write after the call returned.
type reportTool struct {
	mu       sync.Mutex
	stream   *chat.ToolStream
	reserved error
}

func (r *reportTool) tool() chat.Tool {
	return chat.NewTool("report", "Report progress.", func(ctx context.Context, in struct{}) (map[string]any, error) {
		s, ok := chat.ToolStreamFrom(ctx)
		if !ok {
			return nil, errors.New("no tool stream")
		}
		r.mu.Lock()
		r.stream = s
		r.reserved = s.Data("agent-progress", "", map[string]any{})
		r.mu.Unlock()
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
		return map[string]any{"done": true}, nil
	})
}

func reportModel() *scripted.Model {
	return scripted.New(scripted.WithRules(
		scripted.Rule{Name: "after", Match: scripted.LastIsToolResult, Reply: scripted.Always(scripted.Reply{scripted.Text("reported")})},
		scripted.Rule{Name: "call", Match: scripted.LastUserContains("report"), Reply: scripted.Always(scripted.Reply{scripted.ToolCall("report", map[string]any{})})},
	))
}

// TestToolStreamParts: a tool's data parts, transient data and preliminary
// output reach the client live in stream order; the persisted data part
// (its last version) and the final output are in the stored message, in a
// replay of the stream and after a restart, and the transient data is in
// none of them (nor numbered: it has no seq). Reserved data names and a
// preliminary output after the call returned are refused.
func TestToolStreamParts(t *testing.T) {
	dir := t.TempDir()
	rep := &reportTool{}
	class := chatClass("Bot", &kit{model: reportModel(), tools: []chat.Tool{rep.tool()}})
	env, _ := startEnv(t, dir, nil, chat.Config{}, class)
	c := dialReady(t, env, "/agents/bot/parts")
	c.request("r1", userMsgID("u1", "please report"))
	live := c.until(isDone("r1"))

	var order []string
	for _, f := range live {
		if !f.IsChatChunk() || f.ID != "r1" {
			continue
		}
		ch := chunkOf(t, f)
		switch {
		case ch.Type == "data-ping":
			if f.Seq != nil || !ch.IsTransient() {
				t.Errorf("transient frame %s: want transient:true and no seq", f.Raw)
			}
			order = append(order, "ping")
		case ch.Type == "data-status":
			if f.Seq == nil {
				t.Errorf("data frame without seq: %s", f.Raw)
			}
			order = append(order, "status"+string(ch.Data))
		case ch.Type == message.ChunkToolOutputAvailable:
			if ch.Preliminary != nil && *ch.Preliminary {
				order = append(order, "preliminary")
			} else {
				order = append(order, "final"+string(ch.Output))
			}
		}
	}
	want := `status{"n":1} ping status{"n":2} preliminary final{"done":true}`
	if got := strings.Join(order, " "); got != want {
		t.Errorf("live order %q, want %q", got, want)
	}
	rep.mu.Lock()
	stream, reserved := rep.stream, rep.reserved
	rep.mu.Unlock()
	if reserved == nil || !strings.Contains(reserved.Error(), "reserved") {
		t.Errorf("reserved data name: err = %v", reserved)
	}
	if err := stream.Preliminary("late"); !errors.Is(err, chat.ErrToolCallEnded) {
		t.Errorf("preliminary after the call: err = %v, want ErrToolCallEnded", err)
	}

	checkMessage := func(what string, msgs []message.Message) {
		t.Helper()
		last := msgs[len(msgs)-1]
		var data []string
		for _, p := range last.Parts {
			switch {
			case p.IsData():
				data = append(data, p.Type+":"+p.ID+string(p.Data))
			case p.IsTool():
				if string(p.Output) != `{"done":true}` || p.Preliminary != nil {
					t.Errorf("%s: tool part output %s preliminary %v, want the final output", what, p.Output, p.Preliminary)
				}
			}
		}
		if got := strings.Join(data, " "); got != `data-status:s1{"n":2}` {
			t.Errorf("%s: data parts %q, want the last data-status only", what, got)
		}
	}
	checkMessage("stored", getMessages(t, "http://"+env.Host, "/agents/bot/parts"))

	// A replay of the finished stream has the data parts, not the ping.
	c2 := dialReady(t, env, "/agents/bot/parts")
	c2.ack("r1")
	for _, f := range c2.until(isDone("r1")) {
		if f.IsChatChunk() && strings.Contains(f.Body, "data-ping") {
			t.Errorf("replay has the transient chunk: %s", f.Raw)
		}
	}
	replayed := 0
	for _, f := range c2.all {
		if f.IsChatChunk() && strings.Contains(f.Body, "data-status") {
			replayed++
		}
	}
	if replayed != 2 {
		t.Errorf("replay has %d data-status chunks, want 2", replayed)
	}

	env.Close()
	env2, _ := startEnv(t, dir, nil, chat.Config{}, class)
	checkMessage("after a restart", getMessages(t, "http://"+env2.Host, "/agents/bot/parts"))
}

// metaAgent adds its own metadata to every assistant message.
type metaAgent struct {
	chat.Base
	hooks
	mu    sync.Mutex
	infos []chat.MetadataInfo
}

func (a *metaAgent) MessageMetadata(ctx context.Context, info chat.MetadataInfo) any {
	a.mu.Lock()
	a.infos = append(a.infos, info)
	a.mu.Unlock()
	return map[string]any{"app": string(info.Phase)}
}

// TestMessageMetadataAndUsage: an assistant message's metadata carries its
// creation time (the runtime clock), the model id, the finish reason and
// the token usage the model reported, summed over the turn's steps; the
// application's hook is asked at the start and at the finish (with the
// usage), and its keys are merged in. TurnResult reports the same usage.
func TestMessageMetadataAndUsage(t *testing.T) {
	k := &kit{model: toolModel(), tools: weatherTools()}
	var made *metaAgent
	class := agent.Class{Name: "Meta", Public: true, New: func() agent.Agent { made = &metaAgent{hooks: hooks{k}}; return made }}
	r := newRig(t, rigOptions{classes: []agent.Class{class}})
	a := getChat(t, r.rt, "Meta", "m")
	res, err := a.SaveMessages(testCtx(t), []message.Message{userMsg("fine weather")})
	if err != nil || res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("turn: %v %+v", err, res)
	}
	md := chat.MessageMetadata(res.Message)
	if md.CreatedAt != r.rt.Clock().Now().UnixMilli() {
		t.Errorf("createdAt %d, want the clock's %d", md.CreatedAt, r.rt.Clock().Now().UnixMilli())
	}
	if md.Model != "scripted" || md.FinishReason != "stop" {
		t.Errorf("model %q finishReason %q", md.Model, md.FinishReason)
	}
	if md.Usage == nil || md.Usage.InputTokens == 0 || md.Usage.OutputTokens == 0 ||
		md.Usage.TotalTokens != md.Usage.InputTokens+md.Usage.OutputTokens {
		t.Fatalf("usage %+v", md.Usage)
	}
	if *md.TreeUsage != *md.Usage || res.Usage != *md.Usage || res.TreeUsage != *md.Usage {
		t.Errorf("tree usage %+v, result %+v / %+v, want all %+v", md.TreeUsage, res.Usage, res.TreeUsage, md.Usage)
	}
	// Two model calls (the tool call, then the answer): their usage is
	// the sum of what the model reported for each.
	var app map[string]any
	_ = json.Unmarshal(res.Message.Metadata, &app)
	if app["app"] != "finish" {
		t.Errorf("metadata %s: want the hook's finish value merged last", res.Message.Metadata)
	}
	made.mu.Lock()
	defer made.mu.Unlock()
	if len(made.infos) != 2 || made.infos[0].Phase != chat.MetadataStart || made.infos[1].Phase != chat.MetadataFinish ||
		made.infos[1].Metadata.Usage == nil || *made.infos[1].Metadata.Usage != *md.Usage {
		t.Errorf("hook calls %+v", made.infos)
	}
}

// countingModel wraps a model and sums the usage it reports.
type countingModel struct {
	model.Model
	mu  sync.Mutex
	sum model.Usage
}

func (m *countingModel) Stream(ctx context.Context, req *model.Request) iter.Seq2[model.Event, error] {
	return func(yield func(model.Event, error) bool) {
		for ev, err := range m.Model.Stream(ctx, req) {
			if ev.Kind == model.EventFinish {
				m.mu.Lock()
				m.sum.InputTokens += ev.Usage.InputTokens
				m.sum.OutputTokens += ev.Usage.OutputTokens
				m.mu.Unlock()
			}
			if !yield(ev, err) {
				return
			}
		}
	}
}

// TestUsageSumsSteps: the message's usage is the sum of every model
// call's reported usage.
func TestUsageSumsSteps(t *testing.T) {
	cm := &countingModel{Model: toolModel()}
	r := newRig(t, rigOptions{classes: []agent.Class{chatClass("Bot", &kit{model: cm, tools: weatherTools()})}})
	res, err := getChat(t, r.rt, "Bot", "u").SaveMessages(testCtx(t), []message.Message{userMsg("fine weather")})
	if err != nil {
		t.Fatal(err)
	}
	cm.mu.Lock()
	want := chat.Usage{InputTokens: cm.sum.InputTokens, OutputTokens: cm.sum.OutputTokens, TotalTokens: cm.sum.InputTokens + cm.sum.OutputTokens}
	cm.mu.Unlock()
	if res.Usage != want || want.InputTokens == 0 {
		t.Errorf("usage %+v, want %+v", res.Usage, want)
	}
}

// TestFilePartReachesOpenAI: a user message with an image file part goes,
// through the real OpenAI SDK, into the request body of a local
// OpenAI-compatible server; an image over the provider's limit fails the
// turn with an error the user reads.
func TestFilePartReachesOpenAI(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte(`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-test","choices":[{"index":0,"delta":{"role":"assistant","content":"A dot."},"finish_reason":null}]}` + "\n\n" +
			`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-test","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":11,"completion_tokens":3,"total_tokens":14}}` + "\n\n" +
			"data: [DONE]\n\n"))
	}))
	defer srv.Close()
	m := openai.New(openai.Config{BaseURL: srv.URL + "/v1", APIKey: "sk-test", Model: "gpt-test", HTTPClient: srv.Client(), MaxRetries: -1, MaxImageBytes: 100})
	r := newRig(t, rigOptions{classes: []agent.Class{chatClass("Bot", &kit{model: m})}})
	a := getChat(t, r.rt, "Bot", "f")
	const png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
	user := message.Message{Role: message.RoleUser, Parts: []message.Part{
		{Type: message.PartText, Text: "what is this?"},
		{Type: message.PartFile, MediaType: "image/png", Filename: "dot.png", URL: "data:image/png;base64," + png},
	}}
	res, err := a.SaveMessages(testCtx(t), []message.Message{user})
	if err != nil || res.Outcome != chat.OutcomeCompleted || res.Text() != "A dot." {
		t.Fatalf("turn: %v %+v", err, res)
	}
	if res.Usage != (chat.Usage{InputTokens: 11, OutputTokens: 3, TotalTokens: 14}) || chat.MessageMetadata(res.Message).Model != "gpt-test" {
		t.Errorf("usage %+v metadata %s", res.Usage, res.Message.Metadata)
	}
	mu.Lock()
	body := bodies[0]
	mu.Unlock()
	if !strings.Contains(body, `{"image_url":{"url":"data:image/png;base64,`+png+`"},"type":"image_url"}`) {
		t.Errorf("request body lacks the image part:\n%s", body)
	}

	big := user
	big.Parts = []message.Part{user.Parts[0], {Type: message.PartFile, MediaType: "image/png", Filename: "big.png",
		URL: "data:image/png;base64," + strings.Repeat("AAAA", 40)}}
	res, err = getChat(t, r.rt, "Bot", "big").SaveMessages(testCtx(t), []message.Message{big})
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != chat.OutcomeError || res.Error != `file "big.png" is 120 bytes, more than the OpenAI limit of 100 bytes per image` {
		t.Errorf("outcome %q error %q", res.Outcome, res.Error)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 1 {
		t.Errorf("%d requests, want the oversized one never sent", len(bodies))
	}
}

// weatherTools is the weather tool of toolModel.
func weatherTools() []chat.Tool {
	return []chat.Tool{chat.NewTool("weather", "Weather in a city.", func(ctx context.Context, in weatherIn) (weatherOut, error) {
		return weatherOut{TempC: 21}, nil
	})}
}

// TestRecoverRerunsPreliminaryCall: a tool call that wrote a preliminary
// output and was cut by a restart has no final result: the recovered turn
// runs it again, and its final output replaces the preliminary one.
func TestRecoverRerunsPreliminaryCall(t *testing.T) {
	dir := t.TempDir()
	var runs atomic.Int64
	m := scripted.New(scripted.WithRules(
		scripted.Rule{Name: "answer", Match: scripted.LastIsToolResult, Reply: scripted.Always(scripted.Reply{scripted.Text("done")})},
		scripted.Rule{Name: "call", Reply: scripted.Always(scripted.Reply{scripted.ToolCall("slow", map[string]any{})})},
	))
	slow := chat.NewTool("slow", "Works in stages.", func(ctx context.Context, in struct{}) (string, error) {
		if runs.Add(1) == 1 {
			s, _ := chat.ToolStreamFrom(ctx)
			if err := s.Preliminary("stage 1"); err != nil {
				return "", err
			}
			// Cut by the restart.
			return "", agent.Await(ctx, func() error { <-ctx.Done(); return ctx.Err() })
		}
		return "final", nil
	})
	classes := []agent.Class{chatClass("Bot", &kit{model: m, tools: []chat.Tool{slow}})}
	r1 := newRig(t, rigOptions{dir: dir, classes: classes})
	id, err := getChat(t, r1.rt, "Bot", "pre").SubmitMessages(testCtx(t), []message.Message{userMsg("go")}, chat.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r1.db.waitFor(t, "the preliminary output to be persisted", func() bool {
		return count(t, r1.sq, `SELECT COUNT(*) FROM chat_chunks WHERE stream_id = ? AND body LIKE '%"preliminary":true%'`, id) == 1
	})
	r1.close()

	r2 := newRig(t, rigOptions{dir: dir, classes: classes})
	res, err := getChat(t, r2.rt, "Bot", "pre").WaitTurn(testCtx(t), id)
	if err != nil || res.Outcome != chat.OutcomeCompleted || res.Text() != "done" {
		t.Fatalf("recovered turn: %+v, %v", res, err)
	}
	if runs.Load() != 2 {
		t.Fatalf("tool ran %d times, want 2 (again after the restart)", runs.Load())
	}
	tp := toolParts(res.Message)
	if len(tp) != 1 || string(tp[0].Output) != `"final"` || tp[0].Preliminary != nil {
		t.Fatalf("tool parts %+v", tp)
	}
}
