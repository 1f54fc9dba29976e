package scripted

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

func user(text string) model.Message {
	return model.Message{Role: model.RoleUser, Content: []model.Content{model.Text(text)}}
}

func ask(text string) *model.Request {
	return &model.Request{Messages: []model.Message{user(text)}}
}

// kinds lists the events' kinds and payloads compactly.
func kinds(evs []model.Event) []string {
	var out []string
	for _, ev := range evs {
		s := string(ev.Kind)
		switch ev.Kind {
		case model.EventTextDelta, model.EventReasoningDelta:
			s += ":" + ev.Text
		case model.EventToolCallStart:
			s += ":" + ev.ToolCallID + ":" + ev.ToolName
		case model.EventToolCallDelta:
			s += ":" + ev.ToolCallID + ":" + ev.InputDelta
		case model.EventToolCall:
			s += ":" + ev.ToolCallID + ":" + ev.ToolName + ":" + string(ev.Input)
		case model.EventFinish:
			s += ":" + ev.FinishReason
		}
		out = append(out, s)
	}
	return out
}

func TestChunking(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
		text string
		want []string
	}{
		{"default size", nil, "Hello, wonderful world", []string{"Hello, w", "onderful", " world"}},
		{"size 5", []Option{WithChunkSize(5)}, "abcdefghij", []string{"abcde", "fghij"}},
		{"runes not bytes", []Option{WithChunkSize(2)}, "привет", []string{"пр", "ив", "ет"}},
		{"empty text", nil, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := New(append(tc.opts, WithDefault(Always(Reply{Text(tc.text)})))...)
			evs, err := replaytest.Collect(m.Stream(t.Context(), ask("hi")))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, ev := range evs[:len(evs)-1] {
				got = append(got, ev.Text)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("chunks = %q, want %q", got, tc.want)
			}
			if last := evs[len(evs)-1]; last.Kind != model.EventFinish || last.FinishReason != model.FinishStop {
				t.Errorf("last event = %+v, want finish stop", last)
			}
		})
	}
}

func TestDefaultEchoes(t *testing.T) {
	evs, err := replaytest.Collect(New(WithChunkSize(100)).Stream(t.Context(), ask("ping")))
	if err != nil {
		t.Fatal(err)
	}
	if got := kinds(evs); !reflect.DeepEqual(got, []string{"text-delta:You said: ping", "finish:stop"}) {
		t.Errorf("events = %q", got)
	}
}

func TestToolCalls(t *testing.T) {
	m := New(WithChunkSize(6), WithDefault(Always(Reply{
		Reasoning("plan"),
		Text("Checking."),
		ToolCall("search", map[string]string{"q": "go"}),
		ToolCall("clock", json.RawMessage(`{}`)).WithID("fixed"),
	})))
	req := &model.Request{Messages: []model.Message{user("a"), {Role: model.RoleAssistant, Content: []model.Content{model.Text("b")}}, user("c")}}
	evs, err := replaytest.Collect(m.Stream(t.Context(), req))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"reasoning-delta:plan",
		"text-delta:Checki",
		"text-delta:ng.",
		"tool-call-start:call_3_0:search",
		`tool-call-delta:call_3_0:{"q":"`,
		`tool-call-delta:call_3_0:go"}`,
		`tool-call:call_3_0:search:{"q":"go"}`,
		"tool-call-start:fixed:clock",
		"tool-call-delta:fixed:{}",
		"tool-call:fixed:clock:{}",
		"finish:tool-calls",
	}
	if got := kinds(evs); !reflect.DeepEqual(got, want) {
		t.Errorf("events:\n got %q\nwant %q", got, want)
	}
	// The same request gives the same ids.
	again, _ := replaytest.Collect(m.Stream(t.Context(), req))
	if !reflect.DeepEqual(kinds(again), want) {
		t.Errorf("second run differs: %q", kinds(again))
	}
}

func TestToolCallBadInput(t *testing.T) {
	m := New(WithDefault(Always(Reply{Text("x"), ToolCall("t", func() {})})))
	evs, err := replaytest.Collect(m.Stream(t.Context(), ask("hi")))
	if len(evs) != 1 || err == nil || !strings.Contains(err.Error(), `tool call "t"`) {
		t.Errorf("events %v, err %v", kinds(evs), err)
	}
}

func TestFinishStopAfterTextFollowingToolCall(t *testing.T) {
	m := New(WithDefault(Always(Reply{ToolCall("t", nil), Text("done")})))
	evs, err := replaytest.Collect(m.Stream(t.Context(), ask("hi")))
	if err != nil {
		t.Fatal(err)
	}
	if last := evs[len(evs)-1]; last.FinishReason != model.FinishStop {
		t.Errorf("finish reason = %q, want stop", last.FinishReason)
	}
}

func TestFailMidStream(t *testing.T) {
	boom := errors.New("provider exploded")
	m := New(WithChunkSize(4), WithDefault(Always(Reply{Text("abcdefgh"), Fail(boom), Text("never")})))
	evs, err := replaytest.Collect(m.Stream(t.Context(), ask("hi")))
	if got := kinds(evs); !reflect.DeepEqual(got, []string{"text-delta:abcd", "text-delta:efgh"}) {
		t.Errorf("events = %q", got)
	}
	if !errors.Is(err, boom) || !strings.HasPrefix(err.Error(), "scripted: stream: ") {
		t.Errorf("err = %v", err)
	}
}

func TestRuleOrder(t *testing.T) {
	m := New(
		WithRules(
			Rule{Name: "weather", Match: LastUserContains("weather"), Reply: Always(Reply{Text("sunny")})},
			Rule{Name: "weather-in-paris", Match: LastUserContains("Paris"), Reply: Always(Reply{Text("never")})},
		),
		WithRules(Rule{Name: "catch-all", Reply: func(req *model.Request) Reply {
			return Reply{Text(strings.ToUpper(LastUserText(req)))}
		}}),
		WithChunkSize(100),
	)
	for _, tc := range []struct{ ask, rule, text string }{
		{"weather in Paris?", "weather", "sunny"},
		{"Paris?", "weather-in-paris", "never"},
		{"hello", "catch-all", "HELLO"},
	} {
		evs, err := replaytest.Collect(m.Stream(t.Context(), ask(tc.ask)))
		if err != nil {
			t.Fatal(err)
		}
		if evs[0].Text != tc.text {
			t.Errorf("%q: text = %q, want %q", tc.ask, evs[0].Text, tc.text)
		}
	}
	var rules []string
	for _, c := range m.Calls() {
		rules = append(rules, c.Rule)
	}
	if want := []string{"weather", "weather-in-paris", "catch-all"}; !reflect.DeepEqual(rules, want) {
		t.Errorf("rules = %q, want %q", rules, want)
	}
	if got := LastUserText(m.Calls()[2].Request); got != "hello" {
		t.Errorf("recorded request text = %q", got)
	}
}

func TestDelayWithFakeClock(t *testing.T) {
	clock := clockwork.NewFakeClock()
	m := New(WithClock(clock), WithDelay(time.Second), WithChunkSize(1), WithDefault(Always(Reply{Text("abc")})))
	events := make(chan model.Event)
	done := make(chan error, 1)
	go func() {
		for ev, err := range m.Stream(t.Context(), ask("hi")) {
			if err != nil {
				done <- err
				return
			}
			events <- ev
		}
		done <- nil
	}()
	// The first event comes at once; each later one after one second.
	if ev := <-events; ev.Text != "a" {
		t.Fatalf("first event = %+v", ev)
	}
	for _, want := range []string{"b", "c", ""} {
		if err := clock.BlockUntilContext(t.Context(), 1); err != nil {
			t.Fatal(err)
		}
		select {
		case ev := <-events:
			t.Fatalf("event %+v before the delay elapsed", ev)
		default:
		}
		clock.Advance(time.Second)
		if ev := <-events; ev.Text != want {
			t.Fatalf("event = %+v, want text %q", ev, want)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestCancelWhileWaiting(t *testing.T) {
	clock := clockwork.NewFakeClock()
	m := New(WithClock(clock), WithDelay(time.Hour), WithChunkSize(1), WithDefault(Always(Reply{Text("abc")})))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan []model.Event, 1)
	errc := make(chan error, 1)
	go func() {
		evs, err := replaytest.Collect(m.Stream(ctx, ask("hi")))
		done <- evs
		errc <- err
	}()
	if err := clock.BlockUntilContext(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	cancel()
	evs, err := <-done, <-errc
	if len(evs) != 1 || !errors.Is(err, context.Canceled) {
		t.Errorf("events %q, err %v; want one event and context.Canceled", kinds(evs), err)
	}
}

func TestCanceledBeforeStart(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	evs, err := replaytest.Collect(New().Stream(ctx, ask("hi")))
	if len(evs) != 0 || !errors.Is(err, context.Canceled) {
		t.Errorf("events %q, err %v", kinds(evs), err)
	}
}

func TestBreakStops(t *testing.T) {
	m := New(WithChunkSize(1), WithDefault(Always(Reply{Text("abcdef")})))
	n := 0
	for range m.Stream(t.Context(), ask("hi")) {
		n++
		if n == 2 {
			break
		}
	}
	if n != 2 {
		t.Errorf("n = %d", n)
	}
}

func TestUsage(t *testing.T) {
	m := New(WithDefault(Always(Reply{Text("12345678")})))
	evs, err := replaytest.Collect(m.Stream(t.Context(), ask("abcd")))
	if err != nil {
		t.Fatal(err)
	}
	if got := evs[len(evs)-1].Usage; got != (model.Usage{InputTokens: 1, OutputTokens: 2}) {
		t.Errorf("usage = %+v", got)
	}
}

func TestHelpers(t *testing.T) {
	call := func(id string) model.Content {
		return model.Content{Kind: model.ContentToolCall, ToolCallID: id, ToolName: "t", Input: json.RawMessage(`{}`)}
	}
	result := func(id string) model.Content {
		return model.Content{Kind: model.ContentToolResult, ToolCallID: id, ToolName: "t", Output: json.RawMessage(`"ok ` + id + `"`)}
	}
	req := &model.Request{Messages: []model.Message{
		user("first"),
		{Role: model.RoleAssistant, Content: []model.Content{call("1")}},
		{Role: model.RoleTool, Content: []model.Content{result("1")}},
		{Role: model.RoleUser, Content: []model.Content{model.Text("second"), model.Text("line")}},
		{Role: model.RoleAssistant, Content: []model.Content{call("2"), call("3")}},
		{Role: model.RoleTool, Content: []model.Content{result("2")}},
		{Role: model.RoleTool, Content: []model.Content{result("3")}},
	}}
	if got := LastUserText(req); got != "second\nline" {
		t.Errorf("LastUserText = %q", got)
	}
	if !LastIsToolResult(req) {
		t.Error("LastIsToolResult = false")
	}
	got := ToolResults(req)
	if len(got) != 2 || got[0].ToolCallID != "2" || got[1].ToolCallID != "3" {
		t.Errorf("ToolResults = %+v", got)
	}

	req.Messages = req.Messages[:4]
	if LastIsToolResult(req) || ToolResults(req) != nil {
		t.Error("a user message is not a tool result")
	}
	empty := &model.Request{}
	if LastUserText(empty) != "" || LastIsToolResult(empty) || ToolResults(empty) != nil {
		t.Error("helpers on an empty request")
	}
}

func TestCallsAreCopies(t *testing.T) {
	m := New()
	req := ask("original")
	if _, err := replaytest.Collect(m.Stream(t.Context(), req)); err != nil {
		t.Fatal(err)
	}
	req.Messages[0].Content[0].Text = "changed"
	if got := LastUserText(m.Calls()[0].Request); got != "original" {
		t.Errorf("recorded text = %q", got)
	}
}

// TestContinuesCutAnswer: a request that ends with an assistant message
// holding the beginning of the reply (an answer a restart cut) gets the
// rest of the reply only; one whose assistant message is not the reply's
// beginning is answered as it is.
func TestContinuesCutAnswer(t *testing.T) {
	m := New(WithChunkSize(100), WithRules(Rule{Name: "r", Reply: func(req *model.Request) Reply {
		return Reply{Reasoning("think"), Text("Hello, "), Text("world.")}
	}}))
	cut := func(cs ...model.Content) *model.Request {
		req := ask("hi")
		req.Messages = append(req.Messages, model.Message{Role: model.RoleAssistant, Content: cs})
		return req
	}
	reasoning := func(s string) model.Content { return model.Content{Kind: model.ContentReasoning, Text: s} }
	for _, tc := range []struct {
		name string
		req  *model.Request
		want []string
	}{
		{"mid text", cut(reasoning("think"), model.Text("Hello, wo")), []string{"text-delta:rld.", "finish:stop"}},
		{"mid reasoning", cut(reasoning("thi")), []string{"reasoning-delta:nk", "text-delta:Hello, world.", "finish:stop"}},
		{"all said", cut(reasoning("think"), model.Text("Hello, world.")), []string{"finish:stop"}},
		{"cut twice", func() *model.Request {
			req := cut(reasoning("think"), model.Text("Hel"))
			req.Messages = append(req.Messages, model.Message{Role: model.RoleAssistant, Content: []model.Content{model.Text("lo, wo")}})
			return req
		}(), []string{"text-delta:rld.", "finish:stop"}},
		{"not a prefix", cut(model.Text("Goodbye")), []string{"reasoning-delta:think", "text-delta:Hello, ", "text-delta:world.", "finish:stop"}},
	} {
		evs, err := replaytest.Collect(m.Stream(context.Background(), tc.req))
		if err != nil {
			t.Fatal(err)
		}
		if got := kinds(evs); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: events %q, want %q", tc.name, got, tc.want)
		}
	}
	var c model.Model = m
	if cm, ok := c.(model.Continuer); !ok || !cm.ContinuesAnswers() {
		t.Fatal("the scripted model is not a model.Continuer")
	}
}

// TestCallsAreBounded checks that a model keeps the newest calls up to its
// limit (a long-running server's model must not grow without end), and none
// with a negative limit.
func TestCallsAreBounded(t *testing.T) {
	m := New(WithMaxCalls(3))
	for i := range 10 {
		if _, err := replaytest.Collect(m.Stream(t.Context(), ask(fmt.Sprint(i)))); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for _, c := range m.Calls() {
		got = append(got, LastUserText(c.Request))
	}
	if !reflect.DeepEqual(got, []string{"7", "8", "9"}) {
		t.Errorf("calls kept = %q, want the newest three", got)
	}
	if len(m.calls) > 6 {
		t.Errorf("%d calls held, want at most twice the limit", len(m.calls))
	}
	none := New(WithMaxCalls(-1))
	if _, err := replaytest.Collect(none.Stream(t.Context(), ask("x"))); err != nil {
		t.Fatal(err)
	}
	if c := none.Calls(); len(c) != 0 || len(none.calls) != 0 {
		t.Errorf("WithMaxCalls(-1) kept %d calls", len(c))
	}
	if n := len(New().Calls()); n != 0 {
		t.Errorf("a new model has %d calls", n)
	}
}
