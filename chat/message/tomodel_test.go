package message

import (
	"encoding/json"
	"os"
	"reflect"
	"testing"

	"github.com/agentry/agentry/model"
)

// decodeMessage decodes one JSON UI message.
func decodeMessage(t testing.TB, s string) Message {
	t.Helper()
	var m Message
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("decode %s: %v", s, err)
	}
	return m
}

func TestToModelMultiStepToolConversation(t *testing.T) {
	flowC, err := os.ReadFile("testdata/flow_c_message.json")
	if err != nil {
		t.Fatal(err)
	}
	msgs := []Message{
		decodeMessage(t, `{"id":"s1","role":"system","parts":[{"type":"text","text":"You are helpful."}]}`),
		decodeMessage(t, `{"id":"u1","role":"user","parts":[
			{"type":"text","text":"weather in Paris?"},
			{"type":"file","url":"https://x/y.png","mediaType":"image/png"},
			{"type":"data-ctx","data":{"tz":"CET"}}]}`),
		decodeMessage(t, string(flowC)),
		decodeMessage(t, `{"id":"s2","role":"system","parts":[{"type":"text","text":"Be "},{"type":"text","text":"brief."}]}`),
		decodeMessage(t, `{"id":"u2","role":"user","parts":[{"type":"text","text":"Delete item 7,"},{"type":"text","text":"and look up X."}]}`),
		decodeMessage(t, `{"id":"a2","role":"assistant","parts":[
			{"type":"step-start"},
			{"type":"text","text":"Working.","state":"done"},
			{"type":"tool-delete","toolCallId":"c_del","state":"output-denied","input":{"id":7},"approval":{"id":"ap","approved":false,"reason":"not allowed"}},
			{"type":"tool-lookup","toolCallId":"c_look","state":"output-error","rawInput":{"q":"X"},"errorText":"not found"},
			{"type":"dynamic-tool","toolName":"mcp","toolCallId":"c_mcp","state":"input-available","input":{"a":1}},
			{"type":"tool-ask","toolCallId":"c_ask","state":"approval-requested","input":{"q":"?"},"approval":{"id":"ap2"}},
			{"type":"tool-search","toolCallId":"c_search","state":"input-streaming","input":{"q":"par"}},
			{"type":"source-url","sourceId":"s","url":"https://go.dev"},
			{"type":"step-start"},
			{"type":"data-x","data":1},
			{"type":"reasoning","text":""},
			{"type":"step-start"},
			{"type":"text","text":"Done.","state":"done"}]}`),
		decodeMessage(t, `{"id":"u3","role":"user","parts":[{"type":"file","url":"https://x/z.pdf","mediaType":"application/pdf"}]}`),
	}

	system, conv := ToModel(msgs)
	if want := "You are helpful.\n\nBe brief."; system != want {
		t.Errorf("system = %q, want %q", system, want)
	}
	want := []model.Message{
		{Role: model.RoleUser, Content: []model.Content{model.Text("weather in Paris?"),
			{Kind: model.ContentFile, MediaType: "image/png", URL: "https://x/y.png"}}},
		{Role: model.RoleAssistant, Content: []model.Content{
			{Kind: model.ContentToolCall, ToolCallID: "call_1", ToolName: "getWeather", Input: raw(`{"city": "Paris"}`)},
		}},
		{Role: model.RoleTool, Content: []model.Content{
			{Kind: model.ContentToolResult, ToolCallID: "call_1", ToolName: "getWeather", Output: raw(`{"tempC": 21}`)},
		}},
		{Role: model.RoleAssistant, Content: []model.Content{
			{Kind: model.ContentReasoning, Text: "The tool says 21°C."},
			model.Text("It is 21°C in Paris."),
		}},
		{Role: model.RoleUser, Content: []model.Content{model.Text("Delete item 7,"), model.Text("and look up X.")}},
		{Role: model.RoleAssistant, Content: []model.Content{
			model.Text("Working."),
			{Kind: model.ContentToolCall, ToolCallID: "c_del", ToolName: "delete", Input: raw(`{"id":7}`)},
			{Kind: model.ContentToolCall, ToolCallID: "c_look", ToolName: "lookup", Input: raw(`{"q":"X"}`)},
			{Kind: model.ContentToolCall, ToolCallID: "c_mcp", ToolName: "mcp", Input: raw(`{"a":1}`)},
			{Kind: model.ContentToolCall, ToolCallID: "c_ask", ToolName: "ask", Input: raw(`{"q":"?"}`)},
		}},
		{Role: model.RoleTool, Content: []model.Content{
			{Kind: model.ContentToolResult, ToolCallID: "c_del", ToolName: "delete", Output: raw(`"tool execution denied: not allowed"`), IsError: true},
			{Kind: model.ContentToolResult, ToolCallID: "c_look", ToolName: "lookup", Output: raw(`"not found"`), IsError: true},
			{Kind: model.ContentToolResult, ToolCallID: "c_mcp", ToolName: "mcp", Output: raw(`"tool result missing"`), IsError: true},
			{Kind: model.ContentToolResult, ToolCallID: "c_ask", ToolName: "ask", Output: raw(`"tool result missing"`), IsError: true},
		}},
		{Role: model.RoleAssistant, Content: []model.Content{model.Text("Done.")}},
		{Role: model.RoleUser, Content: []model.Content{{Kind: model.ContentFile, MediaType: "application/pdf", URL: "https://x/z.pdf"}}},
	}
	if len(conv) != len(want) {
		t.Fatalf("got %d messages, want %d:\n%s", len(conv), len(want), mustMarshal(t, conv))
	}
	for i := range want {
		if !reflect.DeepEqual(conv[i], want[i]) {
			t.Errorf("message %d:\n got %s\nwant %s", i, mustMarshal(t, conv[i]), mustMarshal(t, want[i]))
		}
	}
}

func TestToModelFromBuilder(t *testing.T) {
	// A message built from a stream converts the same as its stored form.
	b := NewBuilder("a")
	applyAll(t, b, decodeChunks(t, readChunkLines(t, "testdata/flow_c_chunks.jsonl")...)...)
	_, fromBuilder := ToModel([]Message{b.Message()})
	flowC, err := os.ReadFile("testdata/flow_c_message.json")
	if err != nil {
		t.Fatal(err)
	}
	_, fromFixture := ToModel([]Message{decodeMessage(t, string(flowC))})
	if len(fromBuilder) != 3 || len(fromFixture) != 3 {
		t.Fatalf("got %d and %d messages, want 3", len(fromBuilder), len(fromFixture))
	}
	assertJSONEqual(t, mustMarshal(t, fromBuilder), mustMarshal(t, fromFixture))
}

func TestToModelCallInputFallbacks(t *testing.T) {
	msg := decodeMessage(t, `{"id":"a","role":"assistant","parts":[
		{"type":"tool-x","toolCallId":"c1","state":"output-error","rawInput":"{not json","errorText":"bad"},
		{"type":"tool-x","toolCallId":"c2","state":"output-available","input":null},
		{"type":"tool-x","toolCallId":"c3","state":"output-available","input":{"k":1},"output":{"r":2}}]}`)
	_, conv := ToModel([]Message{msg})
	if len(conv) != 2 {
		t.Fatalf("got %d messages", len(conv))
	}
	calls, results := conv[0].Content, conv[1].Content
	for i, want := range []string{`{}`, `{}`, `{"k":1}`} {
		if got := string(calls[i].Input); got != want {
			t.Errorf("call %d input %s, want %s", i, got, want)
		}
	}
	for i, want := range []string{`"bad"`, `null`, `{"r":2}`} {
		if got := string(results[i].Output); got != want {
			t.Errorf("result %d output %s, want %s", i, got, want)
		}
	}
}

func TestToModelEmpty(t *testing.T) {
	system, conv := ToModel(nil)
	if system != "" || conv != nil {
		t.Errorf("ToModel(nil) = %q, %v", system, conv)
	}
}

// TestToModelFileParts: a file part's data: URL is decoded into the
// content's bytes (base64 or percent-encoded), the part's media type and
// file name are kept, and any other URL is passed on as it is.
func TestToModelFileParts(t *testing.T) {
	msgs := []Message{decodeMessage(t, `{"id":"u","role":"user","parts":[
		{"type":"text","text":"see"},
		{"type":"file","mediaType":"image/png","filename":"dot.png","url":"data:image/png;base64,iVBORw0KGgo="},
		{"type":"file","mediaType":"text/plain","url":"data:,hello%20world"},
		{"type":"file","mediaType":"application/pdf","url":"data:application/pdf;base64,JVBERi0"},
		{"type":"file","mediaType":"image/png","url":"data:image/png;base64,@@not base64@@"}]}`)}
	_, conv := ToModel(msgs)
	want := []model.Content{
		model.Text("see"),
		{Kind: model.ContentFile, MediaType: "image/png", Filename: "dot.png", Data: []byte("\x89PNG\r\n\x1a\n")},
		{Kind: model.ContentFile, MediaType: "text/plain", Data: []byte("hello world")},
		{Kind: model.ContentFile, MediaType: "application/pdf", Data: []byte("%PDF-")},
		{Kind: model.ContentFile, MediaType: "image/png", URL: "data:image/png;base64,@@not base64@@"},
	}
	if len(conv) != 1 || !reflect.DeepEqual(conv[0].Content, want) {
		t.Fatalf("got %s\nwant %s", mustMarshal(t, conv), mustMarshal(t, want))
	}
}

// TestVisibleReadOnly: visible, which ToModel reads, is Visible; with
// nothing to leave out it is the parts themselves, not a copy.
func TestVisibleReadOnly(t *testing.T) {
	text := func(s string, meta json.RawMessage) Part {
		return Part{Type: PartText, Text: s, State: StateDone, ProviderMetadata: meta}
	}
	cases := map[string][]Part{
		"plain":       {{Type: PartStepStart}, text("a", nil), {Type: "tool-x", ToolCallID: "c", State: StateOutputAvailable}},
		"continued":   {{Type: PartStepStart}, text("a", ContinuedMetadata), {Type: PartStepStart}, text("b", nil)},
		"interrupted": {{Type: PartStepStart}, text("a", InterruptedMetadata), text("b", nil)},
		"marked step": {{Type: PartStepStart}, text("a", nil), {Type: DataPartPrefix + InterruptedStepName}, {Type: PartStepStart}, text("b", nil)},
		"tool cut":    {{Type: PartStepStart}, {Type: "tool-x", ToolCallID: "c", State: StateInputStreaming, CallProviderMetadata: InterruptedMetadata}},
	}
	for name, parts := range cases {
		got, want := visible(parts), Visible(parts)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: visible = %+v, want %+v", name, got, want)
		}
		alias := &got[0] == &parts[0]
		if hidden := len(want) < len(parts); alias == hidden {
			t.Errorf("%s: visible aliases the parts: %v, want %v", name, alias, !hidden)
		}
	}
}
