package message

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// readChunkLines returns the lines of a JSON-lines fixture.
func readChunkLines(t testing.TB, name string) []string {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" {
			lines = append(lines, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}

// assertJSONEqual fails unless got and want hold the same JSON value.
func assertJSONEqual(t testing.TB, got, want []byte) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("got invalid JSON %s: %v", got, err)
	}
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatalf("want invalid JSON %s: %v", want, err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("JSON differs\n got: %s\nwant: %s", got, compact(t, want))
	}
}

func compact(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func mustMarshal(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestChunkJSONRoundTripRecordedFlow(t *testing.T) {
	for _, line := range readChunkLines(t, "testdata/flow_c_chunks.jsonl") {
		var c Chunk
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("decode %s: %v", line, err)
		}
		if got := string(mustMarshal(t, c)); got != line {
			t.Errorf("round trip changed the chunk\n got: %s\nwant: %s", got, line)
		}
	}
}

func TestChunkJSONRoundTripAllTypes(t *testing.T) {
	chunks := []string{
		`{"type":"start","messageId":"m1","messageMetadata":{"a":1}}`,
		`{"type":"start"}`,
		`{"type":"finish","finishReason":"tool-calls"}`,
		`{"type":"finish","finishReason":"stop","messageMetadata":{"x":true}}`,
		`{"type":"abort","reason":"user stop"}`,
		`{"type":"abort"}`,
		`{"type":"message-metadata","messageMetadata":{"usage":{"in":3}}}`,
		`{"type":"start-step"}`,
		`{"type":"finish-step"}`,
		`{"type":"text-start","id":"t","providerMetadata":{"p":{"k":1}}}`,
		`{"type":"text-delta","id":"t","delta":""}`,
		`{"type":"text-end","id":"t"}`,
		`{"type":"reasoning-start","id":"r"}`,
		`{"type":"reasoning-delta","id":"r","delta":"hm"}`,
		`{"type":"reasoning-end","id":"r"}`,
		`{"type":"tool-input-start","toolCallId":"c","toolName":"x","inputEncoding":"json","providerExecuted":false,"dynamic":true,"title":"X","toolMetadata":{"k":"v"},"providerMetadata":{"p":{}}}`,
		`{"type":"tool-input-delta","toolCallId":"c","inputTextDelta":""}`,
		`{"type":"tool-input-available","toolCallId":"c","toolName":"x","input":{"a":[1,2]},"providerExecuted":true}`,
		`{"type":"tool-input-available","toolCallId":"c","toolName":"x","input":null}`,
		`{"type":"tool-input-error","toolCallId":"c","toolName":"x","input":"{bad","errorText":"invalid input"}`,
		`{"type":"tool-approval-request","approvalId":"ap","toolCallId":"c","approvalDescriptor":{"d":1},"inputSchemaInput":{"s":2},"signature":"sig"}`,
		`{"type":"tool-output-available","toolCallId":"c","output":"done","preliminary":true}`,
		`{"type":"tool-output-available","toolCallId":"c","output":null}`,
		`{"type":"tool-output-error","toolCallId":"c","errorText":"boom"}`,
		`{"type":"tool-output-denied","toolCallId":"c"}`,
		`{"type":"source-url","sourceId":"s","url":"https://example.com","title":"Ex"}`,
		`{"type":"source-document","sourceId":"s","mediaType":"application/pdf","title":"Doc","filename":"d.pdf"}`,
		`{"type":"file","url":"data:text/plain;base64,aGk=","mediaType":"text/plain"}`,
		`{"type":"data-progress","id":"p1","data":{"pct":50},"transient":true}`,
		`{"type":"data-progress","data":null,"transient":false}`,
		`{"type":"error","errorText":"model overloaded"}`,
		// Unknown members, and unknown chunk types (AI SDK v7), survive.
		`{"type":"text-end","id":"t","citations":[{"url":"u"}]}`,
		`{"type":"reset-step","zzz":1}`,
		`{"type":"custom","Type":"case-sensitive member","kind":"x"}`,
	}
	for _, line := range chunks {
		var c Chunk
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("decode %s: %v", line, err)
		}
		if got := string(mustMarshal(t, c)); got != line {
			t.Errorf("round trip changed the chunk\n got: %s\nwant: %s", got, line)
		}
	}
}

func TestChunkConstructors(t *testing.T) {
	tests := []struct {
		c    Chunk
		want string
	}{
		{Start("asst-1"), `{"type":"start","messageId":"asst-1"}`},
		{Start(""), `{"type":"start"}`},
		{StartStep(), `{"type":"start-step"}`},
		{TextStart("t1"), `{"type":"text-start","id":"t1"}`},
		{TextDelta("t1", "It is "), `{"type":"text-delta","id":"t1","delta":"It is "}`},
		{TextDelta("t1", ""), `{"type":"text-delta","id":"t1","delta":""}`},
		{TextEnd("t1"), `{"type":"text-end","id":"t1"}`},
		{ReasoningStart("r"), `{"type":"reasoning-start","id":"r"}`},
		{ReasoningDelta("r", "x"), `{"type":"reasoning-delta","id":"r","delta":"x"}`},
		{ReasoningEnd("r"), `{"type":"reasoning-end","id":"r"}`},
		{ToolInputStart("call_1", "getWeather"), `{"type":"tool-input-start","toolCallId":"call_1","toolName":"getWeather"}`},
		{ToolInputDelta("call_1", `{"city":`), `{"type":"tool-input-delta","toolCallId":"call_1","inputTextDelta":"{\"city\":"}`},
		{ToolInputAvailable("call_1", "getWeather", json.RawMessage(`{"city":"Paris"}`)), `{"type":"tool-input-available","toolCallId":"call_1","toolName":"getWeather","input":{"city":"Paris"}}`},
		{ToolInputError("c", "x", json.RawMessage(`"{bad"`), "bad input"), `{"type":"tool-input-error","toolCallId":"c","toolName":"x","input":"{bad","errorText":"bad input"}`},
		{ToolApprovalRequest("ap1", "c"), `{"type":"tool-approval-request","approvalId":"ap1","toolCallId":"c"}`},
		{ToolOutputAvailable("call_1", json.RawMessage(`{"tempC":21}`)), `{"type":"tool-output-available","toolCallId":"call_1","output":{"tempC":21}}`},
		{ToolOutputError("c", "boom"), `{"type":"tool-output-error","toolCallId":"c","errorText":"boom"}`},
		{ToolOutputDenied("c"), `{"type":"tool-output-denied","toolCallId":"c"}`},
		{FinishStep(), `{"type":"finish-step"}`},
		{Finish("stop"), `{"type":"finish","messageMetadata":{"finishReason":"stop"}}`},
		{Finish(""), `{"type":"finish"}`},
		{MessageMetadata(json.RawMessage(`{"a":1}`)), `{"type":"message-metadata","messageMetadata":{"a":1}}`},
		{Data("weather", "w1", json.RawMessage(`{"tempC":21}`), false), `{"type":"data-weather","id":"w1","data":{"tempC":21}}`},
		{Data("progress", "", json.RawMessage(`1`), true), `{"type":"data-progress","data":1,"transient":true}`},
		{Error("model overloaded"), `{"type":"error","errorText":"model overloaded"}`},
		{Abort("user"), `{"type":"abort","reason":"user"}`},
		{Abort(""), `{"type":"abort"}`},
	}
	for _, tt := range tests {
		if got := string(mustMarshal(t, tt.c)); got != tt.want {
			t.Errorf("got  %s\nwant %s", got, tt.want)
		}
	}
}

func TestChunkEffectiveFinishReason(t *testing.T) {
	for _, tt := range []struct {
		body, want string
	}{
		{`{"type":"finish","finishReason":"stop"}`, "stop"},
		{`{"type":"finish","messageMetadata":{"finishReason":"length"}}`, "length"},
		{`{"type":"finish","finishReason":"tool-calls","messageMetadata":{"finishReason":"stop"}}`, "tool-calls"},
		{`{"type":"finish","messageMetadata":{"finishReason":3}}`, ""},
		{`{"type":"finish"}`, ""},
	} {
		var c Chunk
		if err := json.Unmarshal([]byte(tt.body), &c); err != nil {
			t.Fatal(err)
		}
		if got := c.EffectiveFinishReason(); got != tt.want {
			t.Errorf("%s: got %q, want %q", tt.body, got, tt.want)
		}
	}
}

func TestMessageJSONRoundTripRequestBody(t *testing.T) {
	raw, err := os.ReadFile("testdata/flow_c_request_body.json")
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Messages []Message `json:"messages"`
		Trigger  string    `json:"trigger"`
	}
	if err := json.Unmarshal(raw, &body); err != nil {
		t.Fatal(err)
	}
	if len(body.Messages) != 1 {
		t.Fatalf("got %d messages, want 1", len(body.Messages))
	}
	m := body.Messages[0]
	if m.ID != "9FP6JeRdoTLfVInC" || m.Role != RoleUser || len(m.Parts) != 1 ||
		m.Parts[0].Type != PartText || m.Parts[0].Text != "weather in Paris?" {
		t.Errorf("decoded %+v", m)
	}
	assertJSONEqual(t, mustMarshal(t, body), raw)
}

func TestMessageJSONRoundTripFixture(t *testing.T) {
	raw, err := os.ReadFile("testdata/flow_c_message.json")
	if err != nil {
		t.Fatal(err)
	}
	var m Message
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	assertJSONEqual(t, mustMarshal(t, m), raw)
}

func TestPartJSONRoundTripAllTypes(t *testing.T) {
	parts := []string{
		`{"type":"text","text":"","state":"streaming"}`,
		`{"type":"text","text":"hi","providerMetadata":{"openai":{"id":"x"}}}`,
		`{"type":"reasoning","id":"r","text":"think","state":"done"}`,
		`{"type":"step-start"}`,
		`{"type":"tool-getWeather","toolCallId":"c1","state":"input-streaming"}`,
		`{"type":"tool-getWeather","toolCallId":"c1","state":"input-available","input":{"city":"Paris"},"providerExecuted":false,"title":"Weather","toolMetadata":{"k":1},"callProviderMetadata":{"p":{}}}`,
		`{"type":"tool-getWeather","toolCallId":"c1","state":"output-available","input":{},"output":{"t":1},"preliminary":true,"resultProviderMetadata":{"p":{}}}`,
		`{"type":"tool-getWeather","toolCallId":"c1","state":"output-error","rawInput":"{bad","errorText":"invalid"}`,
		`{"type":"tool-delete","toolCallId":"c2","state":"approval-requested","input":{"id":7},"approval":{"id":"ap1"}}`,
		`{"type":"tool-delete","toolCallId":"c2","state":"approval-responded","input":{"id":7},"approval":{"id":"ap1","approved":false,"reason":"no","isAutomatic":false}}`,
		`{"type":"tool-delete","toolCallId":"c2","state":"output-denied","input":{"id":7},"approval":{"id":"ap1","approved":false,"descriptor":{"d":1},"signature":"s"}}`,
		`{"type":"dynamic-tool","toolName":"mcp_search","toolCallId":"c3","state":"output-available","input":{"q":"x"},"output":[1,2]}`,
		`{"type":"source-url","sourceId":"s1","url":"https://example.com","title":"Example"}`,
		`{"type":"source-document","sourceId":"s2","title":"Doc","mediaType":"application/pdf","filename":"d.pdf"}`,
		`{"type":"file","url":"https://example.com/a.png","mediaType":"image/png","filename":"a.png"}`,
		`{"type":"data-weather","id":"w1","data":{"tempC":21}}`,
		`{"type":"data-note","data":null}`,
		// Unknown members survive, including case variants of known ones.
		`{"type":"text","text":"hi","state":"done","futureField":{"a":[1,{"b":null}]},"Text":"other"}`,
		`{"type":"custom-part","whatever":1}`,
	}
	for _, line := range parts {
		var p Part
		if err := json.Unmarshal([]byte(line), &p); err != nil {
			t.Fatalf("decode %s: %v", line, err)
		}
		assertJSONEqual(t, mustMarshal(t, p), []byte(line))
	}
}

func TestRequiredMembersAlwaysWritten(t *testing.T) {
	tests := []struct {
		v    any
		want string
	}{
		{Part{Type: PartText}, `{"type":"text","text":""}`},
		{Part{Type: PartReasoning}, `{"type":"reasoning","text":""}`},
		{Part{Type: "tool-x"}, `{"type":"tool-x","toolCallId":"","state":""}`},
		{Part{Type: PartDynamicTool}, `{"type":"dynamic-tool","toolName":"","toolCallId":"","state":""}`},
		{Part{Type: "data-x"}, `{"type":"data-x","data":null}`},
		{Part{Type: PartStepStart}, `{"type":"step-start"}`},
		{Message{}, `{"id":"","role":"","parts":[]}`},
		{Approval{}, `{"id":""}`},
		{Chunk{Type: ChunkToolOutputAvailable, ToolCallID: "c"}, `{"type":"tool-output-available","toolCallId":"c","output":null}`},
		{Chunk{Type: ChunkError}, `{"type":"error","errorText":""}`},
	}
	for _, tt := range tests {
		if got := string(mustMarshal(t, tt.v)); got != tt.want {
			t.Errorf("%T: got %s, want %s", tt.v, got, tt.want)
		}
	}
}

func TestMessageUnknownMembersSurvive(t *testing.T) {
	in := `{"id":"m","role":"user","parts":[{"type":"text","text":"x","z":1}],"createdAt":"2025-01-01T00:00:00Z","metadata":{"k":"v"}}`
	var m Message
	if err := json.Unmarshal([]byte(in), &m); err != nil {
		t.Fatal(err)
	}
	assertJSONEqual(t, mustMarshal(t, m), []byte(in))
	// A clone keeps them too, and shares no memory.
	c := m.Clone()
	m.Parts[0].extra["z"][0] = '2'
	m.extra["createdAt"][1] = 'X'
	assertJSONEqual(t, mustMarshal(t, c), []byte(in))
}

func TestUnmarshalErrors(t *testing.T) {
	for _, in := range []string{`[]`, `"x"`, `{"type":1}`, `{"providerExecuted":"yes"}`, `{`} {
		var p Part
		if err := json.Unmarshal([]byte(in), &p); err == nil {
			t.Errorf("part %s: no error", in)
		}
		var c Chunk
		if err := json.Unmarshal([]byte(in), &c); err == nil {
			t.Errorf("chunk %s: no error", in)
		}
	}
	var m Message
	if err := json.Unmarshal([]byte(`{"parts":{}}`), &m); err == nil {
		t.Error("message with object parts: no error")
	}
}

func TestMarshalInvalidRawJSON(t *testing.T) {
	if _, err := json.Marshal(Part{Type: "data-x", Data: json.RawMessage(`{`)}); err == nil {
		t.Error("part with invalid data: no error")
	}
	if _, err := json.Marshal(Chunk{Type: "data-x", Data: json.RawMessage(`nope`)}); err == nil {
		t.Error("chunk with invalid data: no error")
	}
}

func TestPartHelpers(t *testing.T) {
	tests := []struct {
		p                     Part
		isTool, isData, isDyn bool
		name                  string
	}{
		{Part{Type: "tool-getWeather"}, true, false, false, "getWeather"},
		{Part{Type: "tool-"}, true, false, false, ""},
		{Part{Type: PartDynamicTool, DynamicToolName: "mcp_x"}, true, false, true, "mcp_x"},
		{Part{Type: "data-weather"}, false, true, false, ""},
		{Part{Type: PartText}, false, false, false, ""},
		{Part{Type: PartStepStart}, false, false, false, ""},
	}
	for _, tt := range tests {
		if got := tt.p.IsTool(); got != tt.isTool {
			t.Errorf("%s IsTool = %v", tt.p.Type, got)
		}
		if got := tt.p.IsData(); got != tt.isData {
			t.Errorf("%s IsData = %v", tt.p.Type, got)
		}
		if got := tt.p.IsDynamicTool(); got != tt.isDyn {
			t.Errorf("%s IsDynamicTool = %v", tt.p.Type, got)
		}
		if got := tt.p.ToolName(); got != tt.name {
			t.Errorf("%s ToolName = %q, want %q", tt.p.Type, got, tt.name)
		}
	}
}

// TestStructTagsMatchFields keeps the documenting struct tags in step with
// the keys the custom codecs use.
func TestStructTagsMatchFields(t *testing.T) {
	check := func(v any, fields []field) {
		t.Helper()
		typ := reflect.TypeOf(v)
		var tags []string
		for i := range typ.NumField() {
			f := typ.Field(i)
			if !f.IsExported() {
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			tags = append(tags, name)
		}
		var keys []string
		for _, f := range fields {
			keys = append(keys, f.key)
		}
		if !reflect.DeepEqual(tags, keys) {
			t.Errorf("%s: tags %v, codec keys %v", typ.Name(), tags, keys)
		}
	}
	check(Part{}, new(Part).fields())
	check(Chunk{}, new(Chunk).fields())
	check(Message{}, new(Message).fields())
	check(Approval{}, new(Approval).fields())
}
