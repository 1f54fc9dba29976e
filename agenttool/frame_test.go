package agenttool

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/agentry/agentry/wire"
)

// FuzzEncodeFrame checks that encodeFrame writes exactly what json.Marshal
// writes, for every field of an event, and fails where it fails.
func FuzzEncodeFrame(f *testing.F) {
	f.Add("call_1", "r1", `{"type":"text-delta","id":"t","delta":"a<b>&c"}`, int64(7), true, "chunk", "", []byte(nil), int64(0), false, "", false, "", "", uint8(0), "", "")
	f.Add("", "r\u2028", "\x00\x1f\"\\\n\r\t\b\f\u2029\xff\xfe é 😀", int64(-1), false, "chunk", "", []byte(nil), int64(0), false, "", false, "", "", uint8(0), "", "")
	f.Add("p", "r", "", int64(0), true, "started", "Researcher", []byte(`{ "query": "<q>" }`), int64(3), true, "", false, "", "", uint8(0), "label", "A & B")
	f.Add("p", "r", "", int64(29), true, "finished", "", []byte(nil), int64(0), false, "done\u2028", true, "", "", uint8(0), "", "")
	f.Add("", "r", "", int64(1796172059195), true, "interrupted", "", []byte(nil), int64(0), false, "", false, "gave up", "no-progress", uint8(2), "", "")
	f.Add("", "r", "", int64(0), false, "started", "T", []byte(`{"a":`), int64(-5), true, "", false, "", "", uint8(1), "", "")
	f.Fuzz(func(t *testing.T, parent, run, body string, seq int64, replay bool, kind, agentType string, preview []byte,
		order int64, hasOrder bool, summary string, hasSummary bool, errMsg, reason string, still uint8, displayKey, displayValue string) {
		ev := Event{Kind: kind, RunID: run, AgentType: agentType, Body: body, Error: errMsg, Reason: reason}
		if preview != nil {
			ev.InputPreview = json.RawMessage(preview)
		}
		if hasOrder {
			o := int(order)
			ev.Order = &o
		}
		if hasSummary {
			ev.Summary = &summary
		}
		if still%3 != 0 {
			b := still%3 == 1
			ev.ChildStillRunning = &b
		}
		if displayKey != "" {
			ev.Display = Display{displayKey: displayValue, "n": len(displayValue)}
		}
		fr := Frame{Type: wire.AgentToolEvent, ParentToolCallID: parent, Sequence: seq, Replay: replay, Event: ev}
		want, werr := json.Marshal(fr)
		got, err := encodeFrame(fr)
		if (werr != nil) != (err != nil) {
			t.Fatalf("encodeFrame error %v, json.Marshal error %v", err, werr)
		}
		if werr == nil && !bytes.Equal(got, want) {
			t.Fatalf("encodeFrame = %s\njson.Marshal = %s", got, want)
		}
	})
}

func TestEncodeFrameOtherEvents(t *testing.T) {
	order := 3
	msg := "done"
	for _, fr := range []Frame{
		{Type: wire.AgentToolEvent, Sequence: 1, Event: Event{Kind: "chunk", RunID: "r", Body: "b", Order: &order}},
		{Type: wire.AgentToolEvent, Sequence: 2, Event: Event{Kind: "chunk", RunID: "r", Summary: &msg}},
		{Type: wire.AgentToolEvent, Sequence: 3, Event: Event{Kind: "started", RunID: "r", AgentType: "Researcher", InputPreview: json.RawMessage(`{"q":1}`)}},
	} {
		want, _ := json.Marshal(fr)
		got, err := encodeFrame(fr)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("encodeFrame(%+v) = %s, %v; want %s", fr, got, err, want)
		}
	}
}
