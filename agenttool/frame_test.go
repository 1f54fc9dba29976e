package agenttool

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzEncodeFrame checks that encodeFrame writes exactly what json.Marshal
// writes, for chunk frames (the fast path) and any other event.
func FuzzEncodeFrame(f *testing.F) {
	f.Add("call_1", "r1", `{"type":"text-delta","id":"t","delta":"a<b>&c"}`, int64(7), true, "chunk")
	f.Add("", "r\u2028", "\x00\x1f\"\\\n\r\t\b\f\u2029\xff\xfe é 😀", int64(-1), false, "chunk")
	f.Add("p", "r", "", int64(0), true, "finished")
	f.Fuzz(func(t *testing.T, parent, run, body string, seq int64, replay bool, kind string) {
		fr := Frame{Type: FrameType, ParentToolCallID: parent, Sequence: seq, Replay: replay, Event: Event{Kind: kind, RunID: run, Body: body}}
		want, err := json.Marshal(fr)
		if err != nil {
			t.Fatal(err)
		}
		got, err := encodeFrame(fr)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("encodeFrame = %s\njson.Marshal = %s", got, want)
		}
	})
}

func TestEncodeFrameOtherEvents(t *testing.T) {
	order := 3
	msg := "done"
	for _, fr := range []Frame{
		{Type: FrameType, Sequence: 1, Event: Event{Kind: "chunk", RunID: "r", Body: "b", Order: &order}},
		{Type: FrameType, Sequence: 2, Event: Event{Kind: "chunk", RunID: "r", Summary: &msg}},
		{Type: FrameType, Sequence: 3, Event: Event{Kind: "started", RunID: "r", AgentType: "Researcher", InputPreview: json.RawMessage(`{"q":1}`)}},
	} {
		want, _ := json.Marshal(fr)
		got, err := encodeFrame(fr)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("encodeFrame(%+v) = %s, %v; want %s", fr, got, err, want)
		}
	}
}
