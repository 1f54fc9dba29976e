package chat

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/wire"
)

// The hand-written frames are what json.Marshal writes for them: the
// clients and their tests pin the frames' bytes.
func TestFramesMatchJSONMarshal(t *testing.T) {
	seq := 41
	zero := 0
	responses := []wire.ChatResponseFrame{
		{Type: wire.ChatResponse, ID: "s1", Body: `{"type":"text-delta","id":"p","delta":"a<b> & \"c\"\u2028é\n"}`, Seq: &seq},
		{Type: wire.ChatResponse, ID: "s1", Body: `{"type":"data-x","transient":true}`, Continuation: true},
		{Type: wire.ChatResponse, ID: "s1", Body: "", Seq: &zero, Replay: true},
		{Type: wire.ChatResponse, ID: "s1", Replay: true, ReplayComplete: true, Continuation: true},
		{Type: wire.ChatResponse, ID: "s1", Body: "the model failed", Error: true},
		{Type: wire.ChatResponse, ID: "s1", Done: true, Outcome: "completed", MessageIDs: []string{"u1", "u<2>"}},
		{Type: wire.ChatResponse, ID: "s\xff", Done: true, MessageIDs: []string{}},
		{Type: wire.ChatResponse, ID: "s1", Done: true, Error: true, Continuation: true, Replay: true, ReplayComplete: true, Seq: &seq,
			MessageIDs: []string{"a"}, Outcome: "error"},
	}
	for _, f := range responses {
		want, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		if got := encodeResponse(f); !bytes.Equal(got, want) {
			t.Errorf("encodeResponse:\n got %s\nwant %s", got, want)
		}
	}
	var msgs []message.Message
	if err := json.Unmarshal([]byte(`[
		{"id":"u1","role":"user","parts":[{"type":"text","text":"research <TLS> & \"QUIC\""}],"x-client":{"a": 1}},
		{"id":"a1","role":"assistant","metadata":{"finishReason":"stop"},"parts":[
			{"type":"step-start"},
			{"type":"tool-research","toolCallId":"c1","state":"output-available","input":{"query":"TLS"},"output":{"summary":"A & B, in practice."}},
			{"type":"tool-x","toolCallId":"c2","state":"approval-responded","input":{},"approval":{"id":"ap","approved":false,"reason":"no"}},
			{"type":"text","text":"Done.","state":"done","providerMetadata":{ "agentry" : { "interrupted" : true } }},
			{"type":"data-agentry-progress","id":"p1","data":{"fraction":0.5}}]},
		{"id":"a2","role":"assistant"}
	]`), &msgs); err != nil {
		t.Fatal(err)
	}
	for _, f := range []messagesFrame{
		{Type: wire.ChatMessages, Messages: msgs},
		{Type: wire.ChatMessages, Messages: msgs[:1], Connect: true},
		{Type: wire.ChatMessages, Messages: []message.Message{}},
		{Type: wire.ChatMessages},
	} {
		want, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		if got := f.encode(); !bytes.Equal(got, want) {
			t.Errorf("messagesFrame.encode:\n got %s\nwant %s", got, want)
		}
	}
}
