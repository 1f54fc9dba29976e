package message

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

// applyAll applies chunks in order and fails the test on the first error.
func applyAll(t testing.TB, b *Builder, chunks ...Chunk) {
	t.Helper()
	for i, c := range chunks {
		if err := b.Apply(c); err != nil {
			t.Fatalf("chunk %d (%s): %v", i, c.Type, err)
		}
	}
}

// decodeChunks decodes JSON chunk bodies.
func decodeChunks(t testing.TB, bodies ...string) []Chunk {
	t.Helper()
	out := make([]Chunk, len(bodies))
	for i, body := range bodies {
		if err := json.Unmarshal([]byte(body), &out[i]); err != nil {
			t.Fatalf("decode %s: %v", body, err)
		}
	}
	return out
}

func raw(s string) json.RawMessage { return json.RawMessage(s) }

func TestBuilderRecordedFlow(t *testing.T) {
	lines := readChunkLines(t, "testdata/flow_c_chunks.jsonl")
	want, err := os.ReadFile("testdata/flow_c_message.json")
	if err != nil {
		t.Fatal(err)
	}
	b := NewBuilder("client-generated-id")
	applyAll(t, b, decodeChunks(t, lines...)...)
	assertJSONEqual(t, mustMarshal(t, b.Message()), want)
	if got := b.FinishReason(); got != "stop" {
		t.Errorf("FinishReason = %q, want stop", got)
	}
}

func TestBuilderRecordedFlowIntermediateStates(t *testing.T) {
	chunks := decodeChunks(t, readChunkLines(t, "testdata/flow_c_chunks.jsonl")...)
	b := NewBuilder("")
	states := map[int]string{ // chunk index → JSON of the tool part after it
		2: `{"type":"tool-getWeather","toolCallId":"call_1","state":"input-streaming"}`,
		3: `{"type":"tool-getWeather","toolCallId":"call_1","state":"input-streaming","input":{}}`,
		4: `{"type":"tool-getWeather","toolCallId":"call_1","state":"input-streaming","input":{"city":"Paris"}}`,
		5: `{"type":"tool-getWeather","toolCallId":"call_1","state":"input-available","input":{"city":"Paris"}}`,
	}
	for i, c := range chunks {
		if err := b.Apply(c); err != nil {
			t.Fatal(err)
		}
		if want, ok := states[i]; ok {
			assertJSONEqual(t, mustMarshal(t, b.Message().Parts[1]), []byte(want))
		}
		if i == 14 {
			text := b.Message().Parts[4]
			if text.State != StateStreaming || text.Text != "It is 21°C in Paris." {
				t.Errorf("text part while streaming: %+v", text)
			}
		}
	}
}

func TestBuilderNativeFinish(t *testing.T) {
	b := NewBuilder("m")
	applyAll(t, b, decodeChunks(t,
		`{"type":"start","messageMetadata":{"model":"x"}}`,
		`{"type":"finish","finishReason":"tool-calls"}`,
	)...)
	m := b.Message()
	assertJSONEqual(t, m.Metadata, []byte(`{"model":"x","finishReason":"tool-calls"}`))
	if got := b.FinishReason(); got != "tool-calls" {
		t.Errorf("FinishReason = %q", got)
	}
}

func TestBuilderOrderingErrors(t *testing.T) {
	tests := []struct {
		name   string
		before []Chunk
		bad    Chunk
	}{
		{"text-delta without start", nil, TextDelta("t1", "x")},
		{"text-end without start", nil, TextEnd("t1")},
		{"text-delta other id", []Chunk{TextStart("t1")}, TextDelta("t2", "x")},
		{"text-end twice", []Chunk{TextStart("t1"), TextEnd("t1")}, TextEnd("t1")},
		{"text-delta after end", []Chunk{TextStart("t1"), TextEnd("t1")}, TextDelta("t1", "x")},
		{"text-delta after finish-step", []Chunk{StartStep(), TextStart("t1"), FinishStep()}, TextDelta("t1", "x")},
		{"text-delta with reasoning id", []Chunk{ReasoningStart("r1")}, TextDelta("r1", "x")},
		{"reasoning-delta without start", nil, ReasoningDelta("r1", "x")},
		{"reasoning-end without start", nil, ReasoningEnd("r1")},
		{"reasoning-delta with text id", []Chunk{TextStart("t1")}, ReasoningDelta("t1", "x")},
		{"reasoning-end after finish-step", []Chunk{ReasoningStart("r1"), FinishStep()}, ReasoningEnd("r1")},
		{"tool-input-delta without start", nil, ToolInputDelta("c1", "{")},
		{"tool-input-delta after available only", []Chunk{ToolInputAvailable("c1", "x", raw(`{}`))}, ToolInputDelta("c1", "{")},
		{"tool-output-available without part", nil, ToolOutputAvailable("c1", raw(`1`))},
		{"tool-output-available other call", []Chunk{ToolInputAvailable("c1", "x", raw(`{}`))}, ToolOutputAvailable("c2", raw(`1`))},
		{"tool-output-error without part", nil, ToolOutputError("c1", "boom")},
		{"tool-output-denied without part", nil, ToolOutputDenied("c1")},
		{"tool-approval-request without part", nil, ToolApprovalRequest("ap1", "c1")},
		{"missing type", nil, Chunk{}},
		{"invalid input JSON", nil, ToolInputAvailable("c1", "x", raw(`{`))},
		{"invalid data JSON", nil, Data("x", "1", raw(`nope`), false)},
		{"invalid metadata JSON", nil, MessageMetadata(raw(`{"a":`))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := NewBuilder("m")
			applyAll(t, b, tt.before...)
			before := mustMarshal(t, b.Message())
			err := b.Apply(tt.bad)
			var se *StreamError
			if !errors.As(err, &se) {
				t.Fatalf("Apply = %v, want a *StreamError", err)
			}
			if se.ChunkType != tt.bad.Type || !strings.Contains(err.Error(), tt.bad.Type) {
				t.Errorf("error %q does not name chunk type %q", err, tt.bad.Type)
			}
			if after := mustMarshal(t, b.Message()); string(after) != string(before) {
				t.Errorf("failed Apply changed the message\nbefore: %s\n after: %s", before, after)
			}
			// The builder stays usable.
			applyAll(t, b, TextStart("ok"), TextDelta("ok", "fine"), TextEnd("ok"))
		})
	}
}

func TestBuilderToolInputStreaming(t *testing.T) {
	b := NewBuilder("m")
	applyAll(t, b, StartStep(), ToolInputStart("c1", "search"))
	wantInputs := []struct{ delta, input string }{
		{`{"query":"go`, `{"query":"go"}`},
		{` fuzz`, `{"query":"go fuzz"}`},
		{`","limit":1`, `{"query":"go fuzz","limit":1}`},
		{`0,"tags":["a",`, `{"query":"go fuzz","limit":10,"tags":["a"]}`},
		{`tr`, `{"query":"go fuzz","limit":10,"tags":["a",true]}`},
		{`ue]}`, `{"query":"go fuzz","limit":10,"tags":["a",true]}`},
	}
	for _, w := range wantInputs {
		applyAll(t, b, ToolInputDelta("c1", w.delta))
		p := b.Message().Parts[1]
		if p.State != StateInputStreaming {
			t.Errorf("state %q", p.State)
		}
		if string(p.Input) != w.input {
			t.Errorf("after %q: input %s, want %s", w.delta, p.Input, w.input)
		}
	}
	applyAll(t, b, ToolInputAvailable("c1", "search", raw(`{"query":"go fuzz","limit":10,"tags":["a",true]}`)))
	if got := b.Message().Parts; len(got) != 2 || got[1].State != StateInputAvailable {
		t.Errorf("parts %+v", got)
	}
}

func TestBuilderToolLifecycles(t *testing.T) {
	tests := []struct {
		name   string
		chunks []string
		want   string // JSON of the parts
	}{
		{
			name: "tool-input-available creates the part",
			chunks: []string{
				`{"type":"tool-input-available","toolCallId":"c1","toolName":"getLocation","input":{},"title":"Where","toolMetadata":{"k":1},"providerMetadata":{"p":{"a":1}}}`,
			},
			want: `[{"type":"tool-getLocation","toolCallId":"c1","state":"input-available","input":{},"title":"Where","toolMetadata":{"k":1},"callProviderMetadata":{"p":{"a":1}}}]`,
		},
		{
			name: "output error keeps input",
			chunks: []string{
				`{"type":"tool-input-available","toolCallId":"c1","toolName":"x","input":{"a":1}}`,
				`{"type":"tool-output-error","toolCallId":"c1","errorText":"boom","providerMetadata":{"p":{}}}`,
			},
			want: `[{"type":"tool-x","toolCallId":"c1","state":"output-error","input":{"a":1},"errorText":"boom","resultProviderMetadata":{"p":{}}}]`,
		},
		{
			name: "tool-input-error on a streaming part",
			chunks: []string{
				`{"type":"tool-input-start","toolCallId":"c1","toolName":"x"}`,
				`{"type":"tool-input-delta","toolCallId":"c1","inputTextDelta":"{\"a\""}`,
				`{"type":"tool-input-error","toolCallId":"c1","toolName":"x","input":"{\"a\"","errorText":"bad JSON"}`,
			},
			want: `[{"type":"tool-x","toolCallId":"c1","state":"output-error","rawInput":"{\"a\"","errorText":"bad JSON"}]`,
		},
		{
			name: "tool-input-error creates a dynamic part",
			chunks: []string{
				`{"type":"tool-input-error","toolCallId":"c1","toolName":"mcp","input":{"q":1},"errorText":"schema","dynamic":true}`,
			},
			want: `[{"type":"dynamic-tool","toolName":"mcp","toolCallId":"c1","state":"output-error","input":{"q":1},"errorText":"schema"}]`,
		},
		{
			name: "approval requested then denied",
			chunks: []string{
				`{"type":"tool-input-available","toolCallId":"c1","toolName":"delete","input":{"id":7}}`,
				`{"type":"tool-approval-request","approvalId":"ap1","toolCallId":"c1","approvalDescriptor":{"d":1}}`,
				`{"type":"tool-output-denied","toolCallId":"c1"}`,
			},
			want: `[{"type":"tool-delete","toolCallId":"c1","state":"output-denied","input":{"id":7},"approval":{"id":"ap1","descriptor":{"d":1}}}]`,
		},
		{
			name: "approval requested then output",
			chunks: []string{
				`{"type":"tool-input-available","toolCallId":"c1","toolName":"delete","input":{"id":7}}`,
				`{"type":"tool-approval-request","approvalId":"ap1","toolCallId":"c1"}`,
				`{"type":"tool-output-available","toolCallId":"c1","output":"deleted"}`,
			},
			want: `[{"type":"tool-delete","toolCallId":"c1","state":"output-available","input":{"id":7},"output":"deleted","approval":{"id":"ap1"}}]`,
		},
		{
			name: "dynamic tool with preliminary output",
			chunks: []string{
				`{"type":"tool-input-start","toolCallId":"c1","toolName":"mcp","dynamic":true,"providerExecuted":true}`,
				`{"type":"tool-input-available","toolCallId":"c1","toolName":"mcp","input":{"q":"x"},"dynamic":true}`,
				`{"type":"tool-output-available","toolCallId":"c1","output":{"n":1},"preliminary":true,"dynamic":true}`,
				`{"type":"tool-output-available","toolCallId":"c1","output":{"n":2},"dynamic":true}`,
			},
			want: `[{"type":"dynamic-tool","toolName":"mcp","toolCallId":"c1","state":"output-available","input":{"q":"x"},"output":{"n":2},"providerExecuted":true}]`,
		},
		{
			name: "output for a call of an earlier step",
			chunks: []string{
				`{"type":"start-step"}`,
				`{"type":"tool-input-available","toolCallId":"c1","toolName":"x","input":{}}`,
				`{"type":"finish-step"}`,
				`{"type":"start-step"}`,
				`{"type":"tool-output-available","toolCallId":"c1","output":1}`,
			},
			want: `[{"type":"step-start"},{"type":"tool-x","toolCallId":"c1","state":"output-available","input":{},"output":1},{"type":"step-start"}]`,
		},
		{
			name: "same call id in a new step makes a new part",
			chunks: []string{
				`{"type":"start-step"}`,
				`{"type":"tool-input-available","toolCallId":"c1","toolName":"x","input":{"n":1}}`,
				`{"type":"start-step"}`,
				`{"type":"tool-input-available","toolCallId":"c1","toolName":"x","input":{"n":2}}`,
			},
			want: `[{"type":"step-start"},{"type":"tool-x","toolCallId":"c1","state":"input-available","input":{"n":1}},{"type":"step-start"},{"type":"tool-x","toolCallId":"c1","state":"input-available","input":{"n":2}}]`,
		},
		{
			name: "sources and files",
			chunks: []string{
				`{"type":"source-url","sourceId":"s1","url":"https://go.dev","title":"Go"}`,
				`{"type":"source-document","sourceId":"s2","mediaType":"application/pdf","title":"Spec","filename":"spec.pdf"}`,
				`{"type":"file","url":"https://x/y.png","mediaType":"image/png","providerMetadata":{"p":{}}}`,
			},
			want: `[{"type":"source-url","sourceId":"s1","url":"https://go.dev","title":"Go"},{"type":"source-document","sourceId":"s2","mediaType":"application/pdf","title":"Spec","filename":"spec.pdf"},{"type":"file","url":"https://x/y.png","mediaType":"image/png","providerMetadata":{"p":{}}}]`,
		},
		{
			name: "error, abort and unknown chunks change nothing",
			chunks: []string{
				`{"type":"error","errorText":"x"}`,
				`{"type":"abort","reason":"y"}`,
				`{"type":"reset-step"}`,
			},
			want: `[]`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := NewBuilder("m")
			applyAll(t, b, decodeChunks(t, tt.chunks...)...)
			assertJSONEqual(t, mustMarshal(t, b.Message().Parts), []byte(tt.want))
		})
	}
}

func TestBuilderDataPartReplacement(t *testing.T) {
	b := NewBuilder("m")
	applyAll(t, b,
		Data("weather", "w1", raw(`{"status":"loading"}`), false),
		TextStart("t"), TextDelta("t", "hi"), TextEnd("t"),
		Data("weather", "w2", raw(`{"status":"other"}`), false),
		Data("status", "w1", raw(`"same id, other type"`), false),
		Data("weather", "w1", raw(`{"status":"done","tempC":21}`), false),
		Data("log", "", raw(`1`), false),
		Data("log", "", raw(`2`), false),
	)
	want := `[
		{"type":"data-weather","id":"w1","data":{"status":"done","tempC":21}},
		{"type":"text","text":"hi","state":"done"},
		{"type":"data-weather","id":"w2","data":{"status":"other"}},
		{"type":"data-status","id":"w1","data":"same id, other type"},
		{"type":"data-log","data":1},
		{"type":"data-log","data":2}
	]`
	assertJSONEqual(t, mustMarshal(t, b.Message().Parts), []byte(want))
}

func TestBuilderTransientDataNotStored(t *testing.T) {
	b := NewBuilder("m")
	applyAll(t, b, decodeChunks(t,
		`{"type":"data-progress","id":"p","data":{"pct":10},"transient":true}`,
		`{"type":"data-progress","data":{"pct":20},"transient":true}`,
	)...)
	applyAll(t, b, Data("progress", "p", raw(`{"pct":30}`), true))
	if parts := b.Message().Parts; len(parts) != 0 {
		t.Errorf("transient data stored: %+v", parts)
	}
	// A transient chunk does not replace a stored part either.
	applyAll(t, b, Data("progress", "p", raw(`1`), false), Data("progress", "p", raw(`2`), true))
	assertJSONEqual(t, mustMarshal(t, b.Message().Parts), []byte(`[{"type":"data-progress","id":"p","data":1}]`))
}

func TestBuilderMetadataMerge(t *testing.T) {
	b := NewBuilder("m")
	applyAll(t, b,
		Chunk{Type: ChunkStart, MessageID: "asst-9", MessageMetadata: raw(`{"a":{"x":1,"keep":true},"list":[1,2]}`)},
		MessageMetadata(raw(`{"a":{"x":2,"y":3},"list":[3],"n":null}`)),
		MessageMetadata(raw(`null`)),
		Finish("stop"),
	)
	m := b.Message()
	if m.ID != "asst-9" || m.Role != RoleAssistant {
		t.Errorf("id %q role %q", m.ID, m.Role)
	}
	assertJSONEqual(t, m.Metadata, []byte(`{"a":{"x":2,"y":3,"keep":true},"list":[3],"n":null,"finishReason":"stop"}`))

	// A non-object replaces the metadata.
	applyAll(t, b, MessageMetadata(raw(`"plain"`)))
	assertJSONEqual(t, b.Message().Metadata, []byte(`"plain"`))
}

func TestBuilderStartWithoutIDKeepsID(t *testing.T) {
	b := NewBuilder("server-id")
	applyAll(t, b, Start(""))
	if got := b.Message().ID; got != "server-id" {
		t.Errorf("id %q", got)
	}
}

func TestBuilderContinue(t *testing.T) {
	// Flow F of the wire protocol notes: a client tool call ends the first
	// turn; its result is applied to the stored message; a continuation
	// turn appends to the same message.
	first := NewBuilder("")
	applyAll(t, first, decodeChunks(t,
		`{"type":"start","messageId":"asst-2"}`,
		`{"type":"start-step"}`,
		`{"type":"tool-input-start","toolCallId":"call_loc","toolName":"getLocation"}`,
		`{"type":"tool-input-available","toolCallId":"call_loc","toolName":"getLocation","input":{}}`,
		`{"type":"finish-step"}`,
		`{"type":"finish","finishReason":"tool-calls"}`,
	)...)
	stored := first.Message()
	stored.Parts[1].State = StateOutputAvailable
	stored.Parts[1].Output = raw(`{"city":"Paris"}`)

	var b Builder
	if err := b.Continue(stored); err != nil {
		t.Fatal(err)
	}
	applyAll(t, &b,
		Start(""), StartStep(),
		TextStart("t2"), TextDelta("t2", "You are in Paris."), TextEnd("t2"),
		FinishStep(), Finish("stop"),
	)
	want := `{"id":"asst-2","role":"assistant","metadata":{"finishReason":"stop"},"parts":[
		{"type":"step-start"},
		{"type":"tool-getLocation","toolCallId":"call_loc","state":"output-available","input":{},"output":{"city":"Paris"}},
		{"type":"step-start"},
		{"type":"text","text":"You are in Paris.","state":"done"}]}`
	assertJSONEqual(t, mustMarshal(t, b.Message()), []byte(want))

	// The continued message was copied, not modified.
	if len(stored.Parts) != 2 {
		t.Errorf("Continue modified its argument: %d parts", len(stored.Parts))
	}
}

func TestBuilderContinueStreamState(t *testing.T) {
	// Open parts of an earlier stream are not open in the continuation,
	// but tool parts of the continued message can receive results.
	b := NewBuilder("m")
	applyAll(t, b, TextStart("t"), ToolInputAvailable("c1", "x", raw(`{}`)))
	if err := b.Continue(b.Message()); err != nil {
		t.Fatal(err)
	}
	if err := b.Apply(TextDelta("t", "x")); err == nil {
		t.Error("text-delta for a part of the previous stream: no error")
	}
	applyAll(t, b, ToolOutputAvailable("c1", raw(`"ok"`)))
	if got := b.Message().Parts[1].State; got != StateOutputAvailable {
		t.Errorf("state %q", got)
	}
}

func TestBuilderContinueRejectsNonAssistant(t *testing.T) {
	var b Builder
	err := b.Continue(Message{ID: "u1", Role: RoleUser})
	if err == nil || !strings.Contains(err.Error(), "u1") {
		t.Errorf("Continue(user message) = %v", err)
	}
}

func TestBuilderFinalize(t *testing.T) {
	b := NewBuilder("m")
	applyAll(t, b,
		StartStep(),
		ReasoningStart("r"), ReasoningDelta("r", "thinking"),
		TextStart("done"), TextDelta("done", "a"), TextEnd("done"),
		TextStart("t"), TextDelta("t", "partial ans"),
		ToolInputStart("c1", "x"), ToolInputDelta("c1", `{"a":`),
	)
	b.Finalize()
	want := `[{"type":"step-start"},
		{"type":"reasoning","id":"r","text":"thinking","state":"done"},
		{"type":"text","text":"a","state":"done"},
		{"type":"text","text":"partial ans","state":"done"},
		{"type":"tool-x","toolCallId":"c1","state":"input-streaming","input":{}}]`
	assertJSONEqual(t, mustMarshal(t, b.Message().Parts), []byte(want))
	if err := b.Apply(TextDelta("t", "more")); err == nil {
		t.Error("text-delta after Finalize: no error")
	}
}

func TestBuilderMessageIsSnapshot(t *testing.T) {
	b := NewBuilder("m")
	applyAll(t, b,
		Chunk{Type: ChunkStart, MessageMetadata: raw(`{"a":1}`)},
		ToolInputAvailable("c1", "x", raw(`{"k":"v"}`)),
		Data("d", "1", raw(`[1]`), false),
	)
	snap := b.Message()
	snap.Metadata[1] = 'X'
	snap.Parts[0].Input[2] = 'X'
	snap.Parts[1].Data[1] = '9'
	snap.Parts = append(snap.Parts[:0], Part{Type: PartStepStart})
	want := `{"id":"m","role":"assistant","metadata":{"a":1},"parts":[
		{"type":"tool-x","toolCallId":"c1","state":"input-available","input":{"k":"v"}},
		{"type":"data-d","id":"1","data":[1]}]}`
	assertJSONEqual(t, mustMarshal(t, b.Message()), []byte(want))
}

func TestBuilderChunkIsNotAliased(t *testing.T) {
	in := raw(`{"k":"v"}`)
	b := NewBuilder("m")
	applyAll(t, b, ToolInputAvailable("c1", "x", in))
	in[2] = 'X'
	if got := string(b.Message().Parts[0].Input); got != `{"k":"v"}` {
		t.Errorf("builder aliases chunk memory: %s", got)
	}
}

func TestBuilderZeroValue(t *testing.T) {
	var b Builder
	m := b.Message()
	if m.Role != RoleAssistant || m.Parts == nil || len(m.Parts) != 0 {
		t.Errorf("zero Builder message %+v", m)
	}
	applyAll(t, &b, Start("x"), TextStart("t"), TextDelta("t", "y"), TextEnd("t"))
	if got := b.Message(); got.ID != "x" || got.Parts[0].Text != "y" {
		t.Errorf("message %+v", got)
	}
}

func TestParsePartialJSON(t *testing.T) {
	tests := []struct{ in, want string }{
		{``, ``},
		{`   `, ``},
		{`{`, `{}`},
		{`{"`, `{}`},
		{`{"a`, `{}`},
		{`{"a"`, `{}`},
		{`{"a":`, `{}`},
		{`{"a": "b`, `{"a":"b"}`},
		{`{"a":"b\`, `{"a":"b"}`},
		{`{"a":"b\u00`, `{"a":"b"}`},
		{`{"a":"b\u00e9`, `{"a":"b\u00e9"}`},
		{`{"a":"b\"c`, `{"a":"b\"c"}`},
		{`{"a":1`, `{"a":1}`},
		{`{"a":-`, `{}`},
		{`{"a":1.`, `{"a":1}`},
		{`{"a":1e`, `{"a":1}`},
		{`{"a":1,`, `{"a":1}`},
		{`{"a":1,"b"`, `{"a":1}`},
		{`{"a":t`, `{"a":true}`},
		{`{"a":fal`, `{"a":false}`},
		{`{"a":n`, `{"a":null}`},
		{`{"a":[`, `{"a":[]}`},
		{`{"a":[1,2`, `{"a":[1,2]}`},
		{`{"a":[1,2,`, `{"a":[1,2]}`},
		{`{"a":[{"b":[`, `{"a":[{"b":[]}]}`},
		{`{"a":{"b":1},"c":{"d`, `{"a":{"b":1},"c":{}}`},
		{`[`, `[]`},
		{`["x`, `["x"]`},
		{`"abc`, `"abc"`},
		{`12`, `12`},
		{`tr`, `true`},
		{`{"a":1}`, `{"a":1}`},
		{`{"a" : 1 }`, `{"a":1}`},
		// Not a prefix of any JSON text.
		{`{]`, ``},
		{`{"a" 1`, ``},
		{`[1}`, ``},
		{`{"a":1}}`, ``},
		{`{"a":x`, ``},
		{`hello`, ``},
		{`{"a":tx`, ``},
		{`{"a":1-2}`, ``},
	}
	for _, tt := range tests {
		if got := string(parsePartialJSON(tt.in)); got != tt.want {
			t.Errorf("parsePartialJSON(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestParsePartialJSONPrefixes(t *testing.T) {
	// Every prefix of a valid document repairs to valid JSON or to nothing,
	// and the whole document parses as itself.
	doc := `{"query":"caf\u00e9 \"x\"","n":-12.5e+3,"ok":[true,false,null,{"deep":[[]]}],"s":"a\\b"}`
	for i := range len(doc) + 1 {
		got := parsePartialJSON(doc[:i])
		if got != nil && !json.Valid(got) {
			t.Errorf("prefix %q repaired to invalid %q", doc[:i], got)
		}
	}
	var want, got any
	if err := json.Unmarshal([]byte(doc), &want); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(parsePartialJSON(doc), &got); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("whole document: %v, %v", got, err)
	}
}
